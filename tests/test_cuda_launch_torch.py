"""How convbw_mlir.torch picks the path of a CUDA kernel (CONVBW_CUDA_LAUNCH): the choices that need no GPU.
The direct launch itself runs in bench/torch_gpu.py on the GPU (smoke, check, overread, time)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from convbw_mlir import torch as ct  # noqa: E402 - after the skip: it needs torch
from convbw_mlir.cuda_launch import Launch  # noqa: E402
from convbw_mlir.problem import ConvBwdWeightProblem  # noqa: E402
from convbw_mlir.reference import reference  # noqa: E402
from convbw_mlir.torch import entry as ct_entry  # noqa: E402

P = ConvBwdWeightProblem.from_ck("2 2 1 4 4 3 3 6 6 1 1 1 1 1 1 1 1")


class _Op:  # what _call_for reads of a CompiledOp
    def __init__(self, launch):  # noqa: ANN001
        self.problem, self.launch, self.vmfb = P, launch, b""


def test_forced_direct_launch_of_a_refused_schedule_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")
    with pytest.raises(RuntimeError, match=r"CONVBW_CUDA_LAUNCH=direct: .* cannot be launched directly: hal.x"):
        ct_entry.call_for(_Op(Launch(refused="hal.x is not supported")), "cuda", 0)


def test_forced_direct_launch_of_an_artifact_without_schedule_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")
    with pytest.raises(RuntimeError, match="has no launch schedule"):
        ct_entry.call_for(_Op(None), "cuda", 0)


def test_unknown_launch_mode_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ct.LAUNCH_ENV, "fast")
    with pytest.raises(ValueError, match="CONVBW_CUDA_LAUNCH: expected auto, direct or iree, got 'fast'"):
        ct_entry.call_for(_Op(None), "cuda", 0)


def test_cpu_kernels_run_through_iree_whatever_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from convbw_mlir import compile_op
    from convbw_mlir.runtime import PreparedCall

    monkeypatch.setenv(ct.LAUNCH_ENV, "direct")  # the direct launch is CUDA's; the CPU has IREE's runtime only
    op = compile_op(P, "host", output_arg=True)
    assert type(ct_entry.call_for(op, "local-task", None)) is PreparedCall


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_direct_branch_hands_the_kernel_the_callers_tensors_and_returns_its_output(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry point's direct branch on the CPU, its kernel replaced by torch's dW written into the output
    it is handed: the output has the weight's shape in the input's memory format, and is what comes back."""
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(2, 8, 7, 7, generator=g), torch.randn(2, 16, 7, 7, generator=g)
    if fmt == "channels_last":
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    # the float64 reference, not torch's dW (the stand-in kernel's): NCHW is layout 4, G split from C and K
    problem = ConvBwdWeightProblem.from_ck("2 2 2 8 4 3 3 7 7 1 1 1 1 1 1 1 1", layout=4)
    exact = reference(problem, x.double().numpy().reshape(2, 2, 4, 7, 7), dy.double().numpy().reshape(2, 2, 8, 7, 7))
    want = torch.from_numpy(exact.reshape(16, 4, 3, 3)).float()
    handed = []

    def kernel(self, xi, dyi, out):  # noqa: ANN001, ANN202 - stands in for the CUDA launch
        handed.append((xi.data_ptr(), dyi.data_ptr(), out))
        if tuple(out.shape) == (16, 4, 3, 3):  # the accumulate case is checked by what it is handed
            out.copy_(torch.nn.grad.conv2d_weight(xi, (16, 4, 3, 3), dyi, padding=1, groups=2))

    monkeypatch.setattr(ct_entry.DirectCall, "__call__", kernel)
    monkeypatch.setattr(ct_entry, "kernel_for", lambda problem, device: object.__new__(ct_entry.DirectCall))
    monkeypatch.setattr(ct_entry, "_PROBLEMS", {})
    got = ct.conv2d_weight(x, (16, 4, 3, 3), dy, padding=1, groups=2)
    ((xp, dyp, out),) = handed
    assert (xp, dyp) == (x.data_ptr(), dy.data_ptr()) and got is out
    assert got.is_contiguous(memory_format=_memory_format(fmt))
    torch.testing.assert_close(got, want)
    acc = torch.ones_like(want).contiguous(memory_format=_memory_format(fmt))
    assert ct.conv2d_weight(x, (16, 4, 3, 3), dy, padding=1, groups=2, accumulate_into=acc) is acc
    dense = handed[-1][2]  # acc itself, seen in the kernel's dense order: written in place
    assert dense.data_ptr() == acc.data_ptr() and dense.is_contiguous()


def _memory_format(fmt: str) -> torch.memory_format:
    return torch.channels_last if fmt == "channels_last" else torch.contiguous_format
