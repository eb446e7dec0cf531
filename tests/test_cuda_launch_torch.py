"""How convbw_mlir.torch picks the path of a CUDA kernel (CONVBW_CUDA_LAUNCH): the choices that need no GPU.
The direct launch itself runs in bench/torch_gpu.py on the GPU (smoke, check, overread, time)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from convbw_mlir import torch as ct  # noqa: E402 - after the skip: it needs torch
from convbw_mlir.cuda_launch import Launch  # noqa: E402
from convbw_mlir.problem import ConvBwdWeightProblem  # noqa: E402

P = ConvBwdWeightProblem.from_ck("2 2 1 4 4 3 3 6 6 1 1 1 1 1 1 1 1")


class _Op:  # what _call_for reads of a CompiledOp
    def __init__(self, launch):  # noqa: ANN001
        self.problem, self.launch, self.vmfb = P, launch, b""


def test_forced_direct_launch_of_a_refused_schedule_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")
    with pytest.raises(RuntimeError, match=r"CONVBW_CUDA_LAUNCH=direct: .* cannot be launched directly: hal.x"):
        ct._call_for(_Op(Launch(refused="hal.x is not supported")), "cuda", 0)


def test_forced_direct_launch_of_an_artifact_without_schedule_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")
    with pytest.raises(RuntimeError, match="has no launch schedule"):
        ct._call_for(_Op(None), "cuda", 0)


def test_unknown_launch_mode_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "fast")
    with pytest.raises(ValueError, match="CONVBW_CUDA_LAUNCH: expected auto, direct or iree, got 'fast'"):
        ct._call_for(_Op(None), "cuda", 0)


def test_cpu_kernels_run_through_iree_whatever_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from convbw_mlir.compiler import compile_op
    from convbw_mlir.runtime import PreparedCall

    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")  # the direct launch is CUDA's; the CPU has IREE's runtime only
    op = compile_op(P, "host", output_arg=True)
    assert type(ct._call_for(op, "local-task", None)) is PreparedCall
