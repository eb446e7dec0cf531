"""Direct CUDA launch, the compile-time half: the module compiled to IREE's ``hal`` phase, its launch schedule
read there with the MLIR Python bindings (:func:`read_launch`), the kernels read from the
``hal.executable.binary`` (IREE's ``cuda_executable_def.fbs`` flatbuffer: :func:`read_cuda_executable`), and
the same compile continued from ``hal`` to the vmfb (:func:`compile_with_launch`). What it reads is a
:class:`convbw_mlir.cuda_launch.Launch`, which the run-time half launches.

A schedule op this reader does not know makes the whole schedule refused (``Launch.refused`` says why); the
caller then runs the vmfb through IREE's runtime.
"""

from __future__ import annotations

import struct
from typing import Any

from convbw_mlir.build.iree import CompileError, compile_module
from convbw_mlir.cuda_launch import TRANSIENT, Dispatch, ExportDef, Launch, Transfer
from convbw_mlir.targets import resolve

# Byte alignment of each transient buffer in the one workspace a launch gets (cudaMalloc's, and IREE's own)
TRANSIENT_ALIGNMENT = 256

__all__ = ["compile_with_launch", "read_cuda_executable", "read_launch"]


class _Table:
    """A flatbuffer table: just what reading IREE's executable defs needs (little-endian, no verifier:
    the data is our own compiler's output)."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _field(self, index: int) -> int:
        """The absolute position of field ``index``, 0 where it is absent (its default)."""
        off = 4 + 2 * index
        if off >= self.vsize:
            return 0
        rel = struct.unpack_from("<H", self.buf, self.vtable + off)[0]
        return self.pos + rel if rel else 0

    def u32(self, index: int) -> int:
        at = self._field(index)
        return struct.unpack_from("<I", self.buf, at)[0] if at else 0

    def struct_u32(self, index: int, count: int) -> tuple[int, ...]:
        at = self._field(index)
        return struct.unpack_from(f"<{count}I", self.buf, at) if at else (0,) * count

    def _indirect(self, at: int) -> int:
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def bytes_(self, index: int) -> bytes:
        at = self._field(index)
        if not at:
            return b""
        start = self._indirect(at)
        (n,) = struct.unpack_from("<I", self.buf, start)
        return self.buf[start + 4 : start + 4 + n]

    def vector_len(self, index: int) -> int:
        at = self._field(index)
        return struct.unpack_from("<I", self.buf, self._indirect(at))[0] if at else 0

    def tables(self, index: int) -> list[_Table]:
        at = self._field(index)
        if not at:
            return []
        start = self._indirect(at)
        (n,) = struct.unpack_from("<I", self.buf, start)
        return [_Table(self.buf, self._indirect(start + 4 + 4 * i)) for i in range(n)]


def read_cuda_executable(data: bytes) -> tuple[list[ExportDef], list[bytes]]:
    """The exports and PTX images of a ``cuda-nvptx-fb`` executable binary.

    The binary is IREE's 64-byte file header (magic ``CDA1``, version, content size;
    iree/base/internal/flatcc/parsing.h) and an ``iree.hal.cuda.ExecutableDef`` flatbuffer
    (iree/schemas/cuda_executable_def.fbs: exports, modules{ptx_image}).

    Raises:
        ValueError: not a CUDA executable of the version this reader knows.
    """
    if len(data) < 64 or data[:4] != b"CDA1":
        raise ValueError(f"executable: not an IREE CUDA executable (starts with {data[:4]!r})")
    version, size = struct.unpack_from("<IQ", data, 4)
    if version != 0 or size > len(data) - 64:
        raise ValueError(f"executable: header version {version}, size {size} not readable")
    fb = bytes(data[64 : 64 + size])
    if fb[4:8] != b"CDA1":
        raise ValueError(f"executable: flatbuffer identifier {fb[4:8]!r}, expected b'CDA1'")
    root = _Table(fb, struct.unpack_from("<I", fb, 0)[0])
    exports = [
        # ExportDef fields: module_ordinal, kernel_name, block_dims, block_shared_memory_size,
        # constant_count, binding_flags, debug_info
        ExportDef(
            name=e.bytes_(1).decode(),
            module=e.u32(0),
            block=tuple(e.struct_u32(2, 3)),
            shared_memory=e.u32(3),
            constants=e.u32(4),
            bindings=e.vector_len(5),
        )
        for e in root.tables(0)
    ]
    ptx = [m.bytes_(0) for m in root.tables(1)]
    return exports, ptx


# -- the schedule ----------------------------------------------------------------------------------


class _Refused(Exception):
    """A schedule op or form the direct path does not support."""


# ops that carry no device work (asserts, type constants, fences: stream order replaces fences)
_INERT = {
    "arith.constant", "util.null", "util.global.load", "util.return", "util.status.check_ok",
    "hal.memory_type", "hal.buffer_usage", "hal.element_type", "hal.encoding_type", "hal.buffer_view.assert",
    "hal.buffer.assert", "hal.device.allocator", "hal.fence.create", "hal.fence.await", "hal.fence.join",
    "hal.command_buffer.create", "hal.command_buffer.finalize", "hal.executable.lookup.function",
    # a barrier orders what comes before and after: one CUDA stream orders everything already
    "hal.command_buffer.execution_barrier",
}  # fmt: skip


def _segments(op: Any) -> list[list[Any]]:
    """``op``'s operands split by its ``operandSegmentSizes``."""
    from convbw_mlir.ir_imports import ir

    sizes = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    out, i = [], 0
    for n in sizes:
        out.append([op.operands[j] for j in range(i, i + n)])
        i += n
    return out


def _const(value: Any, what: str) -> int:
    """The integer ``value`` is (an ``arith.constant``), or refused naming ``what``."""
    from convbw_mlir.ir_imports import ir

    owner = value.owner
    if isinstance(owner, ir.Operation | ir.OpView) and owner.name == "arith.constant":
        return ir.IntegerAttr(owner.attributes["value"]).value
    raise _Refused(f"{what} is not a constant")


def _flags_zero(op: Any) -> None:
    from convbw_mlir.ir_imports import ir

    if "flags" in op.attributes and ir.IntegerAttr(op.attributes["flags"]).value != 0:
        raise _Refused(f"{op.name} with flags {op.attributes['flags']}")


def _ops(func: Any) -> list[Any]:
    """The ops of a single-block function (control flow is refused)."""
    blocks = list(func.regions[0].blocks)
    if len(blocks) != 1:
        raise _Refused(f"{func.name} @{_sym(func)} has {len(blocks)} blocks (control flow)")
    return [o.operation for o in blocks[0].operations]


def _sym(op: Any) -> str:
    from convbw_mlir.ir_imports import ir

    return ir.StringAttr(op.attributes["sym_name"]).value if "sym_name" in op.attributes else ""


def _symbol_leaf(attr: Any) -> str:
    """The last name of a nested symbol reference (``@a::@b::@c`` -> ``c``)."""
    return str(attr).rsplit("::@", 1)[-1].lstrip("@")


def read_launch(module: Any, function: str = "conv_bwd_weight", readers: dict | None = None) -> Launch:
    """The launch schedule of a module compiled to the ``hal`` phase for CUDA (an ``ir.Module``); ``readers``
    maps executable formats to their readers (default: ``cuda-nvptx-fb``; HIP: convbw_mlir.build.hip_schedule).

    Never raises for an unsupported schedule: the result's ``refused`` says why.
    """
    try:
        return _read(module, function, readers or {"cuda-nvptx-fb": read_cuda_executable})
    except _Refused as e:
        return Launch(function=function, refused=str(e))


def _read(module: Any, function: str, readers: dict) -> Launch:
    from convbw_mlir.ir_imports import ir

    top = {(_sym(o.operation), o.operation.name): o.operation for o in module.body.operations}
    funcs = {sym: op for (sym, name), op in top.items() if name == "util.func"}
    if function not in funcs:
        raise _Refused(f"no public function @{function}")
    # kernels: every hal.executable.binary of format cuda-nvptx-fb
    exports: dict[str, ExportDef] = {}
    ptx: list[bytes] = []
    for (_, name), op in top.items():
        if name != "hal.executable":
            continue
        for inner in op.regions[0].blocks[0].operations:
            inner = inner.operation
            if inner.name == "hal.executable_end":
                continue
            if inner.name != "hal.executable.binary":
                raise _Refused(f"executable @{_sym(op)} holds {inner.name}, not a serialized binary")
            fmt = ir.StringAttr(inner.attributes["format"]).value
            if fmt not in readers:
                raise _Refused(f"executable format {fmt} (the direct path launches {', '.join(readers)})")
            data = bytes(memoryview(ir.DenseIntElementsAttr(inner.attributes["data"])).cast("B"))
            found, images = readers[fmt](data)
            for e in found:
                exports[e.name] = ExportDef(e.name, e.module + len(ptx), e.block, e.shared_memory, e.constants,
                                            e.bindings)  # fmt: skip
            ptx += images
    # the memoized command buffers: global -> the function whose result an initializer stores there
    # (initializers have no symbol name: each one is read, not only the last in ``top``)
    memo: dict[str, str] = {}
    for op in module.body.operations:
        op = op.operation
        if op.name != "util.initializer":
            continue
        calls = {}
        for o in op.regions[0].blocks[0].operations:
            o = o.operation
            if o.name == "util.call":
                calls[o.results[0]] = _symbol_leaf(o.attributes["callee"])
            elif o.name == "util.global.store" and o.operands[0] in calls:
                memo[_symbol_leaf(o.attributes["global"])] = calls[o.operands[0]]

    fn = funcs[function]
    entry = fn.regions[0].blocks[0]
    args: dict[Any, str] = {}
    arg_bytes: list[int] = []
    for i, a in enumerate(entry.arguments):
        t = str(a.type)
        if t not in ("!hal.buffer_view", "!hal.buffer"):
            raise _Refused(f"argument {i} of @{function} is {t} (async fences or other ABIs)")
        args[a] = (f"arg{i}", 0)
        arg_bytes.append(0)
    buffers = dict(args)  # SSA value -> (buffer name, byte offset of its start: transients share one arena)
    steps: list[Dispatch | Transfer] = []
    transient = 0
    recorded: dict[Any, tuple[Any, list[str]]] = {}  # command buffer -> (its recording function, its buffers)
    for op in _ops(fn):
        name = op.name
        if name == "util.call":  # a command buffer recorded per call by a function of the buffers (split-K
            # explicit kernels: their direct bindings keep IREE from memoizing the recording in a global)
            callee = funcs.get(_symbol_leaf(op.attributes["callee"]))
            if callee is None or [str(r.type) for r in op.results] != ["!hal.command_buffer"]:
                what = f"util.call of {op.attributes['callee']}"
                raise _Refused(f"@{function}: {what} (only a command buffer's recording function)")
            recorded[op.results[0]] = (callee, [_buffer(buffers, v) for v in op.operands])
        elif name == "hal.buffer_view.buffer":
            buffers[op.results[0]] = buffers[op.operands[0]]
        elif name == "util.optimization_barrier":  # our copies' barriers (a strided 1x1's x): the same buffers
            buffers.update({r: buffers[v] for r, v in zip(op.results, op.operands, strict=True) if v in buffers})
        elif name == "hal.buffer.assert" and op.operands[0] in buffers:
            b, _ = buffers[op.operands[0]]
            if b.startswith("arg"):
                arg_bytes[int(b[3:])] = max(arg_bytes[int(b[3:])], _const(op.operands[2], "minimum_length"))
        elif name == "hal.device.queue.alloca":  # each one a region of the one transient (the sm_90a maps' too)
            _flags_zero(op)
            # each transient its own aligned part of one arena (a relayout's copies, split-K's partials)
            base = -(-transient // TRANSIENT_ALIGNMENT) * TRANSIENT_ALIGNMENT
            transient = base + _const(op.operands[7], "the transient's size")
            buffers[op.results[0]] = (TRANSIENT, base)
        elif name == "hal.buffer.subspan":  # a view at a constant offset (the fp8 path's K-major copies share one)
            b, base = _buffer(buffers, op.operands[0])
            buffers[op.results[0]] = (b, base + _const(op.operands[1], "a subspan's offset"))
        elif name == "hal.device.queue.dealloca":
            if buffers.get(op.operands[4], ("",))[0] != TRANSIENT:
                raise _Refused("hal.device.queue.dealloca of a buffer that is not the transient")
        elif name == "hal.device.queue.execute.indirect":
            _flags_zero(op)
            # operands: device, affinity, wait, signal, commands, then buffers, offsets, lengths (same variadic size)
            o = list(op.operands)
            n = (len(o) - 5) // 3
            table = [
                (_buffer(buffers, b)[0], _buffer(buffers, b)[1] + _const(off, "a binding offset"))
                for b, off in zip(o[5 : 5 + n], o[5 + n : 5 + 2 * n])
            ]
            steps += _record(*_recorder(o[4], memo, funcs, recorded, buffers), table)
        elif name == "hal.device.queue.execute":
            _flags_zero(op)
            steps += _record(*_recorder(op.operands[4], memo, funcs, recorded, buffers), [])
        elif name in ("hal.device.queue.fill", "hal.device.queue.copy"):
            _flags_zero(op)
            steps.append(_transfer(op, name.rsplit(".", 1)[-1], 4, buffers, []))
        elif name == "hal.buffer_view.create":
            buffers[op.results[0]] = _buffer(buffers, op.operands[0])
        elif name == "util.return":
            for v in op.operands:
                if _buffer(buffers, v)[0] == TRANSIENT:
                    raise _Refused("the result lives in the transient buffer (no output argument)")
        elif name not in _INERT:
            raise _Refused(f"@{function}: {name} is not supported by the direct launch")
    for s in steps:
        if isinstance(s, Dispatch):
            e = exports.get(s.kernel)
            if e is None:
                raise _Refused(f"dispatch of {s.kernel}, which no executable exports")
            if (e.bindings, e.constants) != (len(s.bindings), len(s.constants)):
                raise _Refused(f"{s.kernel}: dispatch passes {len(s.bindings)} bindings and {len(s.constants)} "
                               f"constants, the export takes {e.bindings} and {e.constants}")  # fmt: skip
    if not steps:
        raise _Refused(f"@{function} launches nothing")
    return Launch(function, steps, transient, tuple(arg_bytes), exports, ptx)


def _buffer(buffers: dict, value: Any) -> tuple[str, int]:
    if value not in buffers:
        owner = value.owner
        raise _Refused(f"a buffer from {getattr(owner, 'name', 'a block argument')} (not an argument or the transient)")
    return buffers[value]


def _recorder(value: Any, memo: dict[str, str], funcs: dict[str, Any], recorded: dict,
              buffers: dict) -> tuple[Any, dict]:  # fmt: skip
    """The function recording command buffer ``value`` and the buffers its values name (its arguments
    are the caller's buffers where it is called per call)."""
    if value in recorded:
        func, names = recorded[value]
        return func, {**buffers, **dict(zip(func.regions[0].blocks[0].arguments, names, strict=True))}
    return _memoized(value, memo, funcs), buffers


def _memoized(value: Any, memo: dict[str, str], funcs: dict[str, Any]) -> Any:
    """The function that records the command buffer ``value`` loads (a memoized global)."""
    from convbw_mlir.ir_imports import ir

    owner = value.owner
    if not (isinstance(owner, ir.Operation | ir.OpView) and owner.name == "util.global.load"):
        raise _Refused("a command buffer recorded per call (not memoized)")
    glob = _symbol_leaf(owner.attributes["global"])
    if glob not in memo or memo[glob] not in funcs:
        raise _Refused(f"command buffer global @{glob} is not stored by a memoized function")
    return funcs[memo[glob]]


def _slot(value: Any, table: list[tuple[str, int]], buffers: dict) -> tuple[str, int]:
    """(buffer, offset) of a command buffer's binding: a binding-table slot or a direct buffer."""
    if str(value.type) == "index":
        slot = _const(value, "a binding slot")
        if not 0 <= slot < len(table):
            raise _Refused(f"binding slot {slot} outside the binding table of {len(table)}")
        return table[slot]
    return _buffer(buffers, value)


def _transfer(op: Any, kind: str, first: int, buffers: dict, table: list) -> Transfer:
    """A fill/copy op's transfer; its buffer operands start at ``first``."""
    o = op.operands
    if kind == "fill":
        buf, off = _slot(o[first], table, buffers)
        width = o[first + 3].type.width // 8
        pattern = _const(o[first + 3], "a fill pattern") & ((1 << (8 * width)) - 1)
        return Transfer("fill", (buf, off + _const(o[first + 1], "a fill offset")),
                        _const(o[first + 2], "a fill length"), None, pattern, width)  # fmt: skip
    src, soff = _slot(o[first], table, buffers)
    dst, doff = _slot(o[first + 2], table, buffers)
    return Transfer("copy", (dst, doff + _const(o[first + 3], "a copy offset")), _const(o[first + 4], "a copy length"),
                    (src, soff + _const(o[first + 1], "a copy offset")))  # fmt: skip


def _record(func: Any, buffers: dict, table: list[tuple[str, int]]) -> list[Dispatch | Transfer]:
    """The steps a command-buffer recording function records, its bindings resolved through ``table``."""
    from convbw_mlir.ir_imports import ir

    steps: list[Dispatch | Transfer] = []
    functions: dict[Any, str] = {}
    for op in _ops(func):
        name = op.name
        if name == "hal.executable.lookup.function":
            functions[op.results[0]] = _symbol_leaf(op.attributes["entry_point"])
        elif name == "hal.command_buffer.dispatch":
            _flags_zero(op)
            seg = _segments(op)
            if seg[2][0] not in functions:
                raise _Refused("a dispatch whose function is not a hal.executable.lookup.function")
            grid = tuple(_const(v[0], "a workgroup count") for v in seg[3:6])
            constants = tuple(_const(v, "a push constant") & 0xFFFFFFFF for v in seg[6])
            bindings = []
            for b, off in zip(seg[7], seg[8], strict=True):
                buf, base = _slot(b, table, buffers)
                bindings.append((buf, base + _const(off, "a binding offset")))
            steps.append(Dispatch(functions[seg[2][0]], grid, tuple(bindings), constants))
        elif name == "hal.command_buffer.fill_buffer":
            _flags_zero(op)
            steps.append(_transfer(op, "fill", 1, buffers, table))
        elif name == "hal.command_buffer.copy_buffer":
            _flags_zero(op)
            steps.append(_transfer(op, "copy", 1, buffers, table))
        elif name not in _INERT:
            raise _Refused(f"command buffer @{_sym(func)}: {name} is not supported by the direct launch")
        if name == "hal.command_buffer.create" and ir.IntegerAttr(op.attributes["modes"]).value != 0:
            raise _Refused(f"hal.command_buffer.create modes {op.attributes['modes']}")
    return steps


def compile_with_launch(bytecode: bytes, target: Any, extra_flags: list[str] | None,
                        read: Any = None) -> tuple[bytes, Launch]:  # fmt: skip
    """Compile to the ``hal`` phase, read the launch schedule there (``read``: :func:`read_launch` for CUDA,
    ``build.hip_schedule.read_hip_launch`` for HIP), then continue from ``hal`` to the vmfb (one compile, split
    in two: the vmfb is what a one-shot compile gives).

    Raises:
        CompileError: IREE's diagnostics.
    """
    from convbw_mlir.build import cubin
    from convbw_mlir.ir_imports import ir, new_context

    extra = list(extra_flags or [])
    # opt-in: ptxas's cubins instead of PTX (build/cubin.py); no ptxas is one error before IREE runs
    target = resolve(target)  # a name or a Target, as compile_module takes it
    ptxas = cubin.ptxas() if target.driver == "cuda" and cubin.requested() else None
    hal = compile_module(bytecode, target, [*extra, "--compile-to=hal"])
    if ptxas is not None:
        try:
            hal = cubin.assemble_hal(hal, target, ptxas)
        except cubin.PtxasError as e:
            raise CompileError(str(e)) from None
    with new_context() as ctx:
        try:
            launch = (read or read_launch)(ir.Module.parse(hal, ctx))
        except Exception as e:  # a reader bug must not fail the compile: IREE's runtime still runs the vmfb
            launch = Launch(refused=f"the schedule reader failed: {type(e).__name__}: {e}")
    vmfb = compile_module(hal, target, [*extra, "--compile-from=hal"])
    return vmfb, launch
