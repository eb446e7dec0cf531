"""1-D and 3-D problems in the explicit sm_80 kernel (issue 23, item 1): the GEMM view is 2-D's (M = K,
N = C x taps, reduction = N x output positions); only x's address changes: the tap and the output
position are unravelled row-major over 1, 2 or 3 spatial dimensions (``gemm_sm80._unravel``) and x is
read at ``o * s + f * d - p`` in each. Numerics on the CPU by the sm_80 emulator against float64; the
GPU numbers are still to be measured (bench/explicit_conv.py --suite ranks): until then the plan takes
the kernel for gathered 1-D and 3-D problems only where the strategy asks for it."""

from __future__ import annotations

import numpy as np
import pytest
from sm80_emulator import _Block, _Group, module_error

from convbw_mlir.kernels import gemm_sm80
from convbw_mlir.kernels.ir import Ix
from convbw_mlir.plan import PlanError, decide
from convbw_mlir.policies import amd
from convbw_mlir.policies.sm80 import gemm_shape, takes_by_default
from convbw_mlir.problem import ConvBwdWeightProblem as P


def emulated_error(p: P, **options) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


def conv(size, filt, layout=2, **kw) -> P:
    return P(1, 2, 8, 16, size, filt, layout=layout, **kw)  # one group, two images, C = 8, K = 16


@pytest.mark.parametrize(
    ("problem", "options"),
    [
        (conv((20,), (3,), stride=2, pad_low=1, pad_high=1), {}),  # 1-D, stride 2 (a speech encoder's form)
        (conv((23,), (5,), dilation=2, pad_low=0, pad_high=3), {}),  # 1-D, dilated, padded after only
        (P(1, 2, 16, 36, (40,), (3,), pad_low=1, pad_high=1, layout=2), {"k_batch": 2}),  # K = 36 ragged, split
        (conv((5, 6, 6), (3, 3, 3), stride=(1, 2, 1), dilation=(1, 1, 2), pad_low=1, pad_high=1), {}),
        (conv((4, 7, 5), (2, 3, 1), stride=(2, 1, 1), pad_low=(1, 1, 0), pad_high=(0, 1, 0)), {"k_batch": 3}),
        (P(2, 2, 8, 36, (3, 4, 4), (2, 2, 2), pad_low=1, pad_high=0, layout=2), {}),  # 2 groups, K = 36
        (conv((3, 4, 4), (2, 3, 2), pad_low=1, pad_high=1).with_(dtype="bf16", dw_dtype="f32"), {}),
        (conv((3, 4, 4), (2, 3, 2), pad_low=1, pad_high=1), {"producers": 4}),  # wave specialization
        (conv((20,), (3,), layout=4, stride=2, pad_low=1, pad_high=1), {}),  # layout 4: element-wise gather
        (conv((5, 6, 6), (3, 3, 3), layout=4, stride=(1, 2, 1), dilation=(1, 1, 2), pad_low=1, pad_high=1), {}),
        (conv((3, 4, 4), (2, 3, 2), layout=4, pad_low=1, pad_high=1), {"streamk": 3}),  # StreamK (layout 4)
    ],
)  # fmt: skip
def test_1d_and_3d_kernels_match_float64_under_emulation(problem, options):
    assert emulated_error(problem, **options) < 2e-3


@pytest.mark.parametrize(
    "problem",
    [
        conv((9,), (3,), layout=4, stride=2, dilation=1, pad_low=2, pad_high=1),
        conv((4, 5, 6), (2, 3, 2), layout=4, stride=(1, 2, 1), dilation=(2, 1, 3), pad_low=(1, 0, 2), pad_high=1),
        # 2-D: unequal filters, strides, dilations and pads per dimension; rows past the image's end; 2 output
        # rows where the bound comes from one output step or from the filter's reach alone; padding after only
        P.from_ck("2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1", layout=4),
        P.from_ck("2 1 2 16 8 3 3 11 11 2 2 2 2 2 2 0 0", layout=4),
        P.from_ck("2 1 3 4 4 3 2 7 8 3 1 1 3 1 2 2 0", layout=4),
        P.from_ck("2 1 2 4 4 3 3 6 6 1 1 1 1 2 2 2 2", layout=4),
        P.from_ck("2 1 2 4 4 3 3 3 3 2 2 1 1 1 1 1 1", layout=4),
        P.from_ck("2 1 2 4 4 3 3 2 2 1 1 1 1 1 1 1 1", layout=4),
        P.from_ck("2 1 2 4 4 3 3 6 6 1 1 1 1 0 0 2 2", layout=4),
    ],
)  # fmt: skip
def test_gather_address_map_of_any_rank_matches_the_convolutions_index_formula(problem):
    """``_element_address`` (the gather of x the sm_80 kernel and the CDNA and RDNA kernels share) for every
    (row, reduction index) against ``o * s + f * d - p`` per dimension."""
    from iree.compiler.dialects import func

    from convbw_mlir.ir_imports import ir, new_context

    shape = gemm_shape(problem)
    rows, red = (a.ravel() for a in np.meshgrid(np.arange(shape.n), np.arange(shape.reduction), indexing="ij"))
    with new_context(), ir.Location.unknown():
        index = ir.IndexType.get()
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("address", ([index, index, index], []))
            entry = fn.add_entry_block()
            with ir.InsertionPoint(entry):
                g, row, r = entry.arguments
                op = gemm_sm80._Operand(None, None, None, 0, shape.n, 1, gather=True)
                idx, ok = gemm_sm80._element_address(Ix(entry), shape, op, g, row, r, [])
                func.ReturnOp([])
        emu = _Block(len(rows), (0, 0, 0), {})
        emu.env.update({g: np.int64(0), row: rows, r: red})
        for o in entry.operations:
            for _ in emu.step(o.operation, _Group(None)):
                pass
        got = [emu.idx(v) for v in idx]
        real = np.ones(len(rows), bool) if ok is None else np.broadcast_to(emu.get(ok), (len(rows),))
    taps = np.unravel_index(rows % shape.conv.taps, problem.filter_size)
    outs = np.unravel_index(red % shape.hw, problem.output_size)
    inside = np.ones(len(rows), bool)
    for d in range(problem.rank):
        at = outs[d] * problem.stride[d] + taps[d] * problem.dilation[d] - problem.pad_low[d]
        inside &= (at >= 0) & (at < problem.input_size[d])
        np.testing.assert_array_equal(got[3 + d][inside], at[inside], err_msg=f"dimension {d}")
        assert (got[3 + d] >= 0).all() and (got[3 + d] < problem.input_size[d]).all()
    np.testing.assert_array_equal(real, inside)
    np.testing.assert_array_equal(got[0], red // shape.hw)
    np.testing.assert_array_equal(got[2], rows // shape.conv.taps)


def test_plan_takes_the_kernel_for_gathered_1d_and_3d_by_itself():
    """1-D and 3-D gathers were measured faster than codegen (docs/decisions.md#explicit-by-default): the plan
    takes the kernel by itself; a plain 1x1 of any rank too, as before; strategy=codegen asks for IREE's."""
    for p in (P(8, 1, 64, 64, (64,), (3,), pad_low=1, pad_high=1, layout=2),
              P(8, 1, 64, 64, (8, 16, 16), (3, 3, 3), pad_low=1, pad_high=1, layout=2)):  # fmt: skip
        assert takes_by_default(p) and decide(p, "sm_80").strategy == "explicit"
        assert decide(p, "sm_80", strategy="codegen").strategy != "explicit"
    plain = P(8, 1, 64, 64, (8, 16, 16), (1, 1, 1), layout=2)
    assert takes_by_default(plain) and decide(plain, "sm_80").strategy == "explicit"


def test_amd_kernels_still_refuse_1d_and_3d_gathers_by_name():
    """The shared checks now pass any rank; the AMD forms are emulated for 2-D gathers only."""
    p = P(1, 1, 64, 64, (4, 8, 8), (3, 3, 3), layout=4)
    with pytest.raises(PlanError, match=r"input_size: \(4, 8, 8\) \(the AMD explicit kernel gathers x of 2-D"):
        decide(p, "gfx942", strategy="explicit")
    stored = decide(P(1, 1, 64, 64, (8, 8), (3, 3), layout=4), "gfx942", strategy="explicit")
    assert any(w.startswith("input_size: (4, 8, 8)") for w in amd.refusals(p, stored))
