"""A G-less layout is its grouped twin with G = 1, byte for byte (issue 42 item 6): PyTorch's channels-last
(NHWC/KYXC/NHWK) lies as layout 2 (NHWGC/GKYXC/NHWGK), its contiguous format (NCHW/KCYX/NKHW) as layout 4
(NGCHW/GKCYX/NGKHW). The same bytes get the same plan on every target (on sm_90a our wgmma kernel and its
workspace, where channels-last got IREE's codegen and four times the workspace), and the twin's kernels compute
them behind reshapes (``convbw-relayout``; lit/passes/relayout.mlir shows the IR): numerics on the host through
IREE, and under the sm_80 and sm_90a emulators, against float64."""

from __future__ import annotations

import numpy as np
import pytest
from sm80_emulator import module_error

from convbw_mlir.dispatch.select import select
from convbw_mlir.plan import decide
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue
from convbw_mlir.reference import assert_close, random_inputs, reference
from convbw_mlir.targets import TARGETS

TWINS = [("channels_last", 2), ("torch", 4)]
PROBLEMS = [
    "2 1 32 256 256 3 3 14 14 1 1 1 1 1 1 1 1",  # ResNet-50's 3x3 256@14, N = 32
    "2 1 64 64 64 1 1 56 56 1 1 1 1 0 0 0 0",  # its 64 -> 64 1x1, N = 64
    "2 1 32 128 64 3 3 28 28 2 2 1 1 1 1 1 1",  # a strided 3x3
]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize(("g_less", "grouped"), TWINS)
def test_g_less_layout_gets_its_grouped_twins_plan_on_every_target(target, g_less, grouped):
    for line in PROBLEMS:
        p = P.from_ck(line)
        got, twin = decide(p.with_(layout=g_less), target), decide(p.with_(layout=grouped), target)
        assert got == twin, (line, got, twin)
        assert (got.workspace_bytes, got.deterministic) == (twin.workspace_bytes, twin.deterministic), line


def test_channels_last_on_sm90a_selects_the_wgmma_kernel_with_layout_2s_workspace():
    p = P.from_ck(PROBLEMS[0], layout="channels_last")  # was IREE's codegen with 13.6 MB of workspace (7.1)
    chosen = select(p, "sm_90a", dbs=[], selector=False).variant.plan
    assert sm90.is_sm90(chosen) and chosen == decide(p.with_(layout=2), "sm_90a")
    assert chosen.workspace_bytes == decide(p.with_(layout=2), "sm_90a").workspace_bytes


@pytest.mark.parametrize("layout", ["channels_last", "torch"])
def test_g_less_layout_through_its_twin_matches_float64_on_the_host(layout, compiled):
    from convbw_mlir.epilogues import random_d

    p = P(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1, layout=layout,
          epilogue=Epilogue("bilinear", alpha=0.5, beta=2.0))  # fmt: skip
    x, dy = random_inputs(p, seed=1)
    d = random_d(p, seed=2)  # D in the G-less dW's layout, reshaped to the twin's
    got = np.asarray(compiled(p, "host").run(x, dy, d))
    assert got.shape == p.dw_shape
    assert_close(p, got, reference(p, x, dy, d))


@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (P(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1, layout="channels_last"), {}),
        (P(1, 2, 5, 9, (10, 9), (3, 2), pad_low=(1, 0), pad_high=1, layout="channels_last"), {"k_batch": 2}),
        (P(1, 2, 8, 16, (6, 6), (3, 3), pad_low=1, pad_high=1, layout="torch"), {"layout4": "relayout"}),
    ],
    ids=["channels_last_3x3", "channels_last_odd_split2", "torch_relayout"],
)
def test_g_less_layout_on_sm80_is_its_twins_kernel_under_emulation(problem, options):
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout

    plan = decide(problem, "sm_80", strategy="explicit", **options)
    assert plan == decide(problem.grouped(), "sm_80", strategy="explicit", **options)
    assert module_error(problem, plan, [Relayout(), ExplicitKernel()], seed=3) < 2e-3


def test_channels_last_on_sm90a_is_layout_2s_wgmma_kernel_under_emulation():
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.relayout import Relayout
    from sm90_emulator import run_conv

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels.conv_sm90 import from_problem
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

    p = P(1, 4, 64, 64, (16, 16), (1, 1), dw_dtype="f32", layout="channels_last")
    plan = decide(p, "sm_90a")
    assert sm90.is_sm90(plan) and plan == decide(p.grouped(), "sm_90a")
    tile = plan.tile
    g = from_problem(p.grouped(), Sm90Tiling(bn=tile.n, consumers=tile.subgroups_m, stages=tile.stages), plan.k_batch)
    x, dy = random_inputs(p, seed=1)  # x [N, H, W, C], dy [N, Ho, Wo, K]: the kernel's bindings as they lie
    with new_context():
        module = convbw.build_module(p, plan)
        Relayout().run(module.operation)
        ExplicitKernel().run(module.operation)
        partials = run_conv(module, dy.reshape(g.reduction, -1), x, g)
    want = reference(p, x, dy)
    got = partials.sum(0).reshape(want.shape)
    assert not np.isnan(got).any() and np.abs(got - want).max() / np.abs(want).max() < 1e-6
