"""The prepared-call path (runtime.PreparedCall) and compile_op(output_arg=True), on the CPU device.

No torch needed: numpy arrays go in through DLPack, dW is written into an array the caller owns.
"""

import numpy as np
import pytest

from convbw_mlir import ConvBwdWeightProblem, compile_op
from convbw_mlir.reference import assert_close, random_inputs, reference
from convbw_mlir.runtime import HOST_ALIGNMENT, PreparedCall, aligned_empty

P = ConvBwdWeightProblem(
    groups=2, batch=2, in_channels=4, out_channels=8, input_size=(6, 5), filter_size=(3, 3), pad_low=1, pad_high=1
)


@pytest.fixture(scope="module")
def op_out():
    return compile_op(P, "host", output_arg=True)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def test_output_arg_changes_only_the_signature_and_default_keeps_two_arguments(op_out):
    plain = compile_op(P, "host")
    assert "!hal.buffer {iree.abi.output = 0 : index}" in op_out.stages["linalg"]
    assert "iree.abi.output" not in plain.stages["linalg"]
    x, dy = random_inputs(P)
    assert_close(P, plain.run(x, dy), reference(P, x, dy))  # the default path still works as before


def test_prepared_call_writes_dw_into_the_callers_array_without_copies(op_out):
    call = PreparedCall(op_out.vmfb, "local-task")
    x, dy = (_aligned_copy(a) for a in random_inputs(P))
    out = aligned_empty(P.dw_shape, np.float16)
    out[...] = np.nan
    args = call.prepare(call.import_numpy(x, "f16", "x"), call.import_numpy(dy, "f16", "dy"),
                        call.import_numpy(out, "f16", "out"))  # fmt: skip
    call.invoke(args)
    assert_close(P, out, reference(P, x, dy))
    # the same prepared list reads the arrays' memory itself: a change in x shows in the next call
    x[0] = 0
    call.invoke(args)
    assert_close(P, out, reference(P, x, dy))


def test_prepared_call_refuses_a_vmfb_without_output_argument():
    with pytest.raises(ValueError, match=r"vmfb: conv_bwd_weight takes no output argument.*output_arg=True"):
        PreparedCall(compile_op(P, "host").vmfb, "local-task")


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2, 3, 4)).transpose(1, 0, 2, 3, 4), "not C-contiguous"),
        (lambda a: aligned_empty((a.size + 1,), a.dtype)[1:].reshape(a.shape), f"not {HOST_ALIGNMENT}-byte aligned"),
        (lambda a: np.lib.stride_tricks.as_strided(_aligned_copy(a), writeable=False), "read-only"),
    ],
    ids=["strided", "misaligned", "read-only"],
)
def test_import_numpy_refuses_what_it_cannot_take_without_a_copy_naming_the_argument(op_out, make, why):
    call = PreparedCall(op_out.vmfb, "local-task")
    x, _ = random_inputs(P)
    with pytest.raises(ValueError, match=rf"^x: cannot be passed without a copy: .*{why}"):
        call.import_numpy(make(x), "f16", "x")


def test_aligned_empty_is_aligned_and_contiguous():
    for shape in [(3,), (5, 7), (2, 3, 4)]:
        a = aligned_empty(shape, np.float16)
        assert a.ctypes.data % HOST_ALIGNMENT == 0 and a.flags.c_contiguous and a.shape == shape


def test_async_external_module_queues_calls_on_fences_and_waits_once():
    op = compile_op(P, "host", ["--iree-execution-model=async-external"], output_arg=True)
    call = PreparedCall(op.vmfb, "local-task")
    assert call.is_async
    x, dy = (_aligned_copy(a) for a in random_inputs(P))
    out = aligned_empty(P.dw_shape, np.float16)
    out[...] = np.nan
    args = call.prepare(call.import_numpy(x, "f16"), call.import_numpy(dy, "f16"), call.import_numpy(out, "f16"))
    for _ in range(5):
        call.invoke(args, wait=False)
    call.wait()
    assert_close(P, out, reference(P, x, dy))
    assert call._timeline.query() == 5  # one signal per call, in order on the kernel's timeline


def test_output_arg_kernels_are_cached_apart_from_the_default_and_a_hit_starts_no_child(tmp_path, monkeypatch):
    import convbw_mlir.build.isolate
    from convbw_mlir.dispatch import KernelCache

    cache = KernelCache(tmp_path)
    first = compile_op(P, "host", output_arg=True, cache=cache, isolate=True)
    plain = compile_op(P, "host", cache=cache)
    assert cache.info().entries == 2  # one key per ABI
    monkeypatch.setattr(convbw_mlir.build.isolate, "call", lambda *a, **k: pytest.fail("a cache hit started a child"))
    again = compile_op(P, "host", output_arg=True, cache=cache, isolate=True)
    assert again.vmfb == first.vmfb and again.selection is not None
    PreparedCall(again.vmfb, "local-task")  # it has the output argument
    with pytest.raises(ValueError, match="takes no output argument"):
        PreparedCall(plain.vmfb, "local-task")


def test_iree_forms_the_dispatcher_may_pick_get_the_same_output_argument():
    from convbw_mlir.dispatch.build import compile_variant
    from convbw_mlir.dispatch.variants import Variant

    op = compile_variant(P, "host", Variant("iree_direct"), output_arg=True)
    call = PreparedCall(op.vmfb, "local-task")
    x, dy = (_aligned_copy(a) for a in random_inputs(P))
    out = aligned_empty(P.dw_shape, np.float16)
    call.invoke(call.prepare(call.import_numpy(x, "f16", "x"), call.import_numpy(dy, "f16", "dy"),
                             call.import_numpy(out, "f16", "out")))  # fmt: skip
    assert_close(P, out, reference(P, x, dy))
