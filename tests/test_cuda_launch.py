"""The direct CUDA launch's compile side: the schedule read at the hal phase of real sm_80 compiles, the
kernels from IREE's CUDA executable flatbuffer, the artifact round trip and the refusals. The launch
itself needs a GPU: bench/torch_gpu.py (smoke, check, overread, time) runs it."""

from __future__ import annotations

import json
import math

import pytest
from conftest import compiled_op

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.build.cuda_schedule import read_cuda_executable, read_launch
from convbw_mlir.build.iree import compile_module
from convbw_mlir.cuda_launch import TRANSIENT, Dispatch, Launch
from convbw_mlir.problem import ConvBwdWeightProblem

pytest.importorskip("iree.compiler")

# split-K with a padded copy of x (3 dispatches: pad, partial products, reduction)
SPLIT = ConvBwdWeightProblem.from_ck("2 960 32 1 1 3 3 7 7 1 1 1 1 1 1 1 1")
# a 1x1 convolution without padding or split: one dispatch straight from the arguments
UNSPLIT = ConvBwdWeightProblem.from_ck("2 1 4 1024 1024 1 1 7 7 1 1 1 1 0 0 0 0")


@pytest.fixture(scope="session")
def split_op() -> CompiledOp:
    return compiled_op(SPLIT, "sm_80", output_arg=True)


@pytest.fixture(scope="session")
def unsplit_op() -> CompiledOp:
    return compiled_op(UNSPLIT, "sm_80", output_arg=True)


@pytest.fixture(scope="session")
def split_hal(split_op: CompiledOp) -> bytes:
    return compile_module(split_op.stages["linalg"], "sm_80", ["--compile-to=hal"])


def _bytes(shape: tuple[int, ...], dtype_bytes: int = 2) -> int:
    return math.prod(shape) * dtype_bytes


def _ptx_entry(launch: Launch, name: str) -> str:
    """The PTX text of kernel ``name``'s entry, from its signature to its body's first brace."""
    ptx = launch.ptx[launch.exports[name].module].decode()
    start = ptx.index(f".entry {name}(")
    return ptx[start : ptx.index("{", start)]


def test_split_schedule_pads_x_into_the_transient_and_reduces_into_the_output(split_op: CompiledOp) -> None:
    launch = split_op.launch
    assert launch is not None and launch.refused is None, launch and launch.refused
    assert launch.function == "conv_bwd_weight"
    steps = launch.steps
    assert [type(s) for s in steps] == [Dispatch] * 3
    pad, conv, reduce = steps
    assert pad.bindings[0][0] == "arg0" and pad.bindings[-1][0] == TRANSIENT  # x -> padded copy
    assert "arg1" in [b for b, _ in conv.bindings]  # dy read by the partial products
    assert reduce.bindings[-1][0] == "arg2"  # the caller's dW
    assert launch.transient > _bytes(SPLIT.dw_shape, 4)  # the f32 partials live there
    assert launch.arg_bytes == (_bytes(SPLIT.x_shape), _bytes(SPLIT.dy_shape), _bytes(SPLIT.dw_shape))
    for s in steps:
        assert all(isinstance(g, int) and g > 0 for g in s.grid), s
        assert all(off >= 0 for _, off in s.bindings)


def test_unsplit_schedule_is_one_dispatch_on_the_arguments(unsplit_op: CompiledOp) -> None:
    launch = unsplit_op.launch
    assert launch.refused is None, launch.refused
    assert launch.transient == 0
    (only,) = launch.steps
    assert sorted(b for b, _ in only.bindings) == ["arg0", "arg1", "arg2"]
    assert only.bindings[-1][0] == "arg2"  # written last: the caller's dW


@pytest.mark.parametrize("which", ["split_op", "unsplit_op"])
def test_exports_agree_with_the_ptx_they_carry(which: str, request: pytest.FixtureRequest) -> None:
    launch = request.getfixturevalue(which).launch
    assert launch.ptx and all(p.startswith(b"//") and b".target sm_80" in p for p in launch.ptx)
    for d in launch.dispatches:
        e = launch.exports[d.kernel]
        entry = _ptx_entry(launch, d.kernel)
        # IREE's CUDA ABI: one .param per binding, then one per 32-bit constant, in that order
        assert entry.count(".param") == e.bindings + e.constants == len(d.bindings) + len(d.constants)
        ptx = launch.ptx[e.module].decode()
        tail = ptx[ptx.index(f".entry {d.kernel}(") :]
        assert f".maxntid {e.block[0]}, {e.block[1]}, {e.block[2]}" in tail[: tail.index("{")], (d.kernel, e.block)


def test_some_export_needs_more_than_the_default_dynamic_shared_memory() -> None:
    # layout 4's 3x3 mma kernel asks for 50 KiB: the launcher must opt in above 48 KiB (cuFuncSetAttribute)
    p = ConvBwdWeightProblem.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1").with_(layout=4)
    launch = compiled_op(p, "sm_80", output_arg=True, layout4="gather").launch
    assert max(e.shared_memory for e in launch.exports.values()) > 48 * 1024


def test_executable_reader_refuses_other_formats() -> None:
    with pytest.raises(ValueError, match="not an IREE CUDA executable"):
        read_cuda_executable(b"HSACO" + bytes(100))


def test_vmfb_continued_from_hal_is_the_one_shot_program(split_op: CompiledOp, split_hal: bytes) -> None:
    from convbw_mlir.ir_imports import ir, new_context

    one_shot = compile_module(split_op.stages["linalg"], "sm_80", ["--compile-to=vm"])
    continued = compile_module(split_hal, "sm_80", ["--compile-from=hal", "--compile-to=vm"])
    with new_context() as ctx:  # the same VM program; only debug locations differ
        texts = [ir.Module.parse(m, ctx).operation.get_asm(enable_debug_info=False) for m in (one_shot, continued)]
    assert texts[0] == texts[1]


def test_saved_artifact_round_trips_the_launch(split_op: CompiledOp, tmp_path) -> None:  # noqa: ANN001
    split_op.save(tmp_path / "op")
    meta = json.loads((tmp_path / "op" / "op.json").read_text())
    folder = tmp_path / "op" / meta["files"]
    assert (folder / "launch.json").is_file() and (folder / "launch-0.ptx").read_bytes() == split_op.launch.ptx[0]
    loaded = CompiledOp.load(tmp_path / "op")
    assert loaded.launch == split_op.launch
    assert loaded.vmfb == split_op.vmfb


def test_host_compile_has_no_launch(tmp_path) -> None:  # noqa: ANN001
    op = compiled_op(ConvBwdWeightProblem.from_ck("2 2 1 4 4 3 3 6 6 1 1 1 1 1 1 1 1"), "host")
    assert op.launch is None
    op.save(tmp_path / "host")
    assert not any(p.name.startswith("launch") for p in (tmp_path / "host").rglob("*"))
    assert CompiledOp.load(tmp_path / "host").launch is None


def test_malformed_launch_file_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="launch.json: malformed"):
        Launch.from_files(lambda name: b'{"steps": [{"dispatch": "k"}]}')


# -- refusals: the schedule is not launched directly, and says why --------------------------------------
def _parse(hal: bytes):  # noqa: ANN202
    from convbw_mlir.ir_imports import ir, new_context

    ctx = new_context()
    return ctx, ir.Module.parse(hal, ctx)


def _first(module, name: str):  # noqa: ANN001, ANN202
    found = []

    def visit(op):  # noqa: ANN001, ANN202
        if op.name == name:
            found.append(op)
        return __import__("convbw_mlir.ir_imports").ir_imports.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found[0]


def test_computed_workgroup_count_is_refused(split_hal: bytes) -> None:
    from convbw_mlir.ir_imports import arith_d, ir

    ctx, module = _parse(split_hal)
    with ctx, ir.Location.unknown():
        dispatch = _first(module, "hal.command_buffer.dispatch")
        with ir.InsertionPoint(dispatch):
            doubled = arith_d.addi(dispatch.operands[3], dispatch.operands[3])
        dispatch.operands[3] = doubled
        launch = read_launch(module)
    assert launch.refused is not None and "arith.addi is not supported" in launch.refused
    assert launch.steps == [] and launch.ptx == []


def test_dispatch_with_flags_is_refused(split_hal: bytes) -> None:
    from convbw_mlir.ir_imports import ir

    ctx, module = _parse(split_hal)
    with ctx:
        dispatch = _first(module, "hal.command_buffer.dispatch")
        dispatch.attributes["flags"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 1)
        launch = read_launch(module)
    assert launch.refused is not None and "hal.command_buffer.dispatch with flags" in launch.refused


def test_async_external_module_is_refused_at_compile_time() -> None:
    from convbw_mlir import compile_op

    op = compile_op(SPLIT, "sm_80", ["--iree-execution-model=async-external"], output_arg=True)
    assert op.launch.refused is not None and "!hal.fence" in op.launch.refused
    assert op.vmfb  # the vmfb is still built: the IREE runtime runs it


def test_kernel_cache_keeps_the_launch(tmp_path) -> None:  # noqa: ANN001
    from convbw_mlir import compile_op
    from convbw_mlir.dispatch import KernelCache

    built = compile_op(UNSPLIT, "sm_80", output_arg=True, cache=tmp_path)
    (stored,) = (tmp_path / "entries").rglob("launch.json")
    cached = KernelCache(tmp_path).get(stored.parent.name)  # the entry read back, as a later process would
    assert cached.launch is not None and cached.launch.refused is None
    assert cached.launch == built.launch
    assert compile_op(UNSPLIT, "sm_80", output_arg=True, cache=tmp_path).launch == built.launch


def test_explicit_split_schedule_records_its_command_buffer_per_call() -> None:
    # The explicit kernel's split-K binds x and dy directly: IREE records its command buffer in a function
    # called per call (util.call), not in a memoized global; the reader maps that function's arguments.
    problem = ConvBwdWeightProblem.from_ck("2 1 2 36 256 3 3 50 50 1 1 1 1 1 1 1 1")
    op = compiled_op(problem, "sm_80", output_arg=True)
    assert op.plan.strategy == "explicit" and op.plan.k_batch > 1
    launch = op.launch
    assert launch.refused is None, launch.refused
    gemm, reduce = launch.steps
    assert gemm.kernel == "gemm" and [b for b, _ in gemm.bindings] == ["arg1", "arg0", TRANSIENT]  # dy, x
    assert gemm.grid[2] == op.plan.k_batch  # one z slice a split
    assert [b for b, _ in reduce.bindings] == [TRANSIENT, "arg2"]  # the partials summed into the caller's dW
    assert launch.transient >= op.plan.k_batch * _bytes(problem.dw_shape, 4)
    assert launch.exports["gemm"].shared_memory > 48 * 1024  # over the default: the launcher raises the limit


def test_strided_1x1_schedule_reads_both_memoized_command_buffers_across_the_copy_barrier() -> None:
    # A strided 1x1 through IREE's codegen: the copy of x at the stride and the GEMM are two memoized command
    # buffers (two initializers, which have no symbol name), the copy's result held by util.optimization_barrier
    # between them. ResNet-50's stride-2 downsamples fell back to IREE's runtime on this (torch_enable results).
    # (The torch layout's own plan is layout 4's, our kernel on channels-last copies: codegen asked for here.)
    problem = ConvBwdWeightProblem.from_ck("2 1 4 64 32 1 1 14 14 2 2 1 1 0 0 0 0", layout="torch")
    op = compiled_op(problem, "sm_80", output_arg=True, strategy="codegen")
    assert op.plan.strategy == "iree" and op.plan.gemm
    launch = op.launch
    assert launch.refused is None, launch.refused
    copy, gemm = launch.steps
    assert [b for b, _ in copy.bindings] == ["arg0", TRANSIENT]  # x at the stride, into the transient
    assert [b for b, _ in gemm.bindings] == ["arg1", TRANSIENT, "arg2"]  # dy and the copy into the caller's dW


def test_layout4_relayout_schedule_gives_each_transient_its_own_part_of_the_workspace() -> None:
    # Layout 4 computed in layout 2 (decisions.md#layout4): IREE allocates the transposed x, the transposed dy
    # and split-K's partials as three transients; each gets its own aligned part of the one workspace.
    problem = ConvBwdWeightProblem.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1").with_(layout=4)
    op = compiled_op(problem, "sm_80", output_arg=True)
    assert op.plan.channels_last and op.plan.k_batch > 1
    launch = op.launch
    assert launch.refused is None, launch.refused
    x_t, dy_t, gemm, reduce = launch.steps
    assert x_t.bindings[0] == ("arg0", 0) and dy_t.bindings[0] == ("arg1", 0)
    x_at, dy_at, partials_at = x_t.bindings[1], dy_t.bindings[1], gemm.bindings[2]
    assert {b for b, _ in (x_at, dy_at, partials_at)} == {TRANSIENT}
    assert [gemm.bindings[0], gemm.bindings[1]] == [dy_at, x_at]
    x_bytes, dy_bytes = _bytes(problem.x_shape, 2), _bytes(problem.dy_shape, 2)
    starts = sorted(off for _, off in (x_at, dy_at, partials_at))
    assert all(a % 256 == 0 for a in starts) and starts[1] - starts[0] >= min(x_bytes, dy_bytes)
    assert launch.transient >= x_bytes + dy_bytes + op.plan.k_batch * _bytes(problem.dw_shape, 4)
    assert reduce.bindings == ((TRANSIENT, partials_at[1]), ("arg2", 0))  # stage 2 writes dW transposed


@pytest.mark.parametrize(
    ("target", "capability", "refused"),
    [
        ("sm_90a", (9, 0), False),
        ("sm_90a", (8, 0), True),  # wgmma / setmaxnreg: only the chip the PTX is specific to
        ("sm_90a", (10, 0), True),
        ("sm_80", (9, 0), False),  # plain PTX is compiled forward by the driver's JIT
        ("sm_89", (8, 0), True),
    ],
)
def test_launcher_refuses_ptx_the_device_cannot_run_naming_target_and_capability(target, capability, refused):
    from convbw_mlir.cuda_launch import check_ptx_targets

    ptx = [b"//\n.version 8.0\n.target " + target.encode() + b"\n.address_size 64\n"]
    if not refused:
        check_ptx_targets(ptx, capability)
        return
    major, minor = capability
    with pytest.raises(ValueError, match=f"{target} PTX, which a device of compute capability {major}.{minor}"):
        check_ptx_targets(ptx, capability)
