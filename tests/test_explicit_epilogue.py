"""Epilogues in the explicit sm_80 kernel's store (issue 23, item 6): scale, bilinear and accumulate.

Unsplit, the kernel reads D where it stores a pair of dW (``gemm_sm80.Fused``); split-K, the kernel writes
plain partials and the epilogue rides in the generic that sums them. Numerics under the sm_80 emulator
against the float64 reference with the epilogue; the plan no longer falls back to codegen for them."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir.plan import PlanError, decide
from convbw_mlir.policies.sm80 import takes_by_default
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue

# 2 groups, K = 36 (ragged M, 8-byte copies), N = 144 (ragged in 128-wide tiles), 4 k tiles
BASE = P(2, 4, 16, 36, (8, 8), (3, 3), pad_low=1, pad_high=1, layout=2)
EPILOGUES = [
    Epilogue("scale", alpha=0.5),
    Epilogue("bilinear", alpha=2.0, beta=-0.5),
    Epilogue("bilinear", alpha=1.5, beta=2.0, d_dtype="f32"),
    Epilogue("accumulate"),
]


def emulated_error(p: P, **options) -> float:
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=5)


@pytest.mark.parametrize("ep", EPILOGUES, ids=lambda e: e.tag if hasattr(e, "tag") else str(e))
@pytest.mark.parametrize("options", [{}, {"k_batch": 2}], ids=["in_the_store", "in_the_split_sum"])
def test_epilogue_matches_float64_under_emulation(ep, options):
    assert emulated_error(BASE.with_(epilogue=ep), **options) < 2e-3


def test_epilogue_with_odd_channels_and_f32_dw_matches_float64():
    p = P(1, 2, 3, 9, (12, 12), (7, 7), stride=2, pad_low=3, pad_high=3, layout=2, dw_dtype="f32")
    assert emulated_error(p.with_(epilogue=Epilogue("bilinear", 2.0, 2.0))) < 2e-3


def test_epilogue_in_bf16_matches_float64():
    p = BASE.with_(dtype="bf16", dw_dtype="bf16", epilogue=Epilogue("bilinear", 2.0, 0.5, d_dtype="f32"))
    assert emulated_error(p) < 2.0**-8


def test_dropping_d_from_the_store_is_caught(monkeypatch):
    """The check sees the D term: a store that ignores D (scale only) is wrong for bilinear."""
    from convbw_mlir.kernels import gemm_sm80

    real = gemm_sm80._finish
    monkeypatch.setattr(gemm_sm80, "_finish", lambda acc, out, fused, at: real(acc, out, gemm_sm80.Fused(2.0, 0.0), at))
    assert emulated_error(BASE.with_(epilogue=Epilogue("bilinear", 2.0, 2.0))) > 0.01


@pytest.mark.parametrize("ep", EPILOGUES[:2], ids=["scale", "bilinear"])
def test_plan_keeps_the_explicit_kernel_for_epilogue_problems(ep):
    p = BASE.with_(epilogue=ep)
    assert takes_by_default(p) and decide(p, "sm_80").strategy == "explicit"
    assert decide(p, "sm_80") == decide(BASE, "sm_80")  # the plan records no epilogue decision


@pytest.mark.parametrize(
    ("options", "message"),
    [({"producers": 4}, "producers: 4 with a bilinear epilogue"),
     ({"streamk": 3}, "streamk: 3 with the bilinear epilogue (StreamK")],
)  # fmt: skip
def test_forms_without_an_epilogue_refuse_it_by_name(options, message):
    p = BASE.with_(layout=4 if "streamk" in options else 2, epilogue=Epilogue("bilinear", 2.0, 2.0))
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        decide(p, "sm_80", strategy="explicit", **options)
