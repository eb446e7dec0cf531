"""Direct CUDA launch: a compiled module's kernels launched on torch's stream, without the IREE runtime.

All shapes are static, so what IREE's runtime does per call is fixed at compile time: the module's
``hal`` phase holds it as IR (a memoized command buffer of ``hal.command_buffer.dispatch`` ops with
constant workgroup counts, a ``hal.device.queue.alloca`` of a constant-size transient buffer, and
``hal.device.queue.execute.indirect`` binding the arguments and the transient). At compile time
(:func:`compile_with_launch`) the module is compiled to ``hal``, that schedule is read with the MLIR
Python bindings (:func:`read_launch`) together with the kernels from the ``hal.executable.binary``
(IREE's ``cuda_executable_def.fbs`` flatbuffer: PTX image, block dims, dynamic shared memory), and the
same compile continues from ``hal`` to the vmfb. At run time :class:`CudaLauncher` loads the PTX once
per device and launches each dispatch with ``cuLaunchKernel`` on the caller's stream (fills and copies
as async memset/memcpy), with kernel parameters in IREE's CUDA ABI: one 64-bit device pointer per
binding (base + binding-table offset + dispatch offset), then each 32-bit constant
(runtime/src/iree/hal/drivers/cuda/stream_command_buffer.c, ``..._dispatch``). No host wait, no
runtime, capturable by CUDA graphs (docs/torch.md).

A schedule op this reader does not know makes the whole schedule refused (:attr:`Launch.refused`
says why); the caller then runs the vmfb through IREE's runtime.
"""

from __future__ import annotations

import ctypes
import json
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LAUNCH_FILE",
    "CudaError",
    "CudaLauncher",
    "Dispatch",
    "ExportDef",
    "Launch",
    "Transfer",
    "compile_with_launch",
    "read_cuda_executable",
    "read_launch",
]

LAUNCH_FILE = "launch.json"
TRANSIENT = "transient"  # the buffer name of the module's transient (split-K partials, padded copies)


# -- the kernels: IREE's CUDA executable flatbuffer ------------------------------------------------
@dataclass(frozen=True)
class ExportDef:
    """One kernel of the executable (``iree.hal.cuda.ExportDef``)."""

    name: str
    module: int  # index into Launch.ptx
    block: tuple[int, int, int]
    shared_memory: int  # dynamic shared memory per block, bytes
    constants: int  # 32-bit push constants, passed after the bindings
    bindings: int


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
@dataclass(frozen=True)
class Dispatch:
    """One kernel launch: ``bindings`` are (buffer, byte offset) with buffer ``arg<i>`` or ``transient``."""

    kernel: str
    grid: tuple[int, int, int]
    bindings: tuple[tuple[str, int], ...]
    constants: tuple[int, ...] = ()


@dataclass(frozen=True)
class Transfer:
    """A fill (``pattern`` of ``pattern_bytes`` bytes over ``length`` bytes of ``target``) or a copy
    (``length`` bytes from ``source`` to ``target``); buffers are (name, byte offset)."""

    kind: str  # "fill" or "copy"
    target: tuple[str, int]
    length: int
    source: tuple[str, int] | None = None
    pattern: int = 0
    pattern_bytes: int = 0


@dataclass
class Launch:
    """A module's launch schedule and kernels, or why it cannot be launched directly.

    Attributes:
        function: the exported function.
        steps: dispatches and transfers in stream order.
        transient: bytes of the transient workspace (0: none).
        arg_bytes: minimum byte length per function argument (IREE's ``hal.buffer.assert``).
        exports: the kernels by name.
        ptx: the PTX images.
        refused: why the schedule is not supported (then the rest is empty); None when it is.
    """

    function: str = ""
    steps: list[Dispatch | Transfer] = field(default_factory=list)
    transient: int = 0
    arg_bytes: tuple[int, ...] = ()
    exports: dict[str, ExportDef] = field(default_factory=dict)
    ptx: list[bytes] = field(default_factory=list)
    refused: str | None = None

    @property
    def dispatches(self) -> list[Dispatch]:
        return [s for s in self.steps if isinstance(s, Dispatch)]

    # -- persistence (beside the vmfb in CompiledOp's artifact folder) ---------------------------
    def files(self) -> dict[str, bytes]:
        """``launch.json`` and one ``launch-<i>.ptx`` per PTX image."""
        meta = {
            "function": self.function,
            "refused": self.refused,
            "transient": self.transient,
            "arg_bytes": list(self.arg_bytes),
            "exports": [vars(e) | {"block": list(e.block)} for e in self.exports.values()],
            "steps": [
                {"dispatch": s.kernel, "grid": list(s.grid), "bindings": [list(b) for b in s.bindings],
                 "constants": list(s.constants)}
                if isinstance(s, Dispatch)
                else {s.kind: list(s.target), "length": s.length,
                      "source": list(s.source) if s.source else None,
                      "pattern": s.pattern, "pattern_bytes": s.pattern_bytes}
                for s in self.steps
            ],
            "ptx": [f"launch-{i}.ptx" for i in range(len(self.ptx))],
        }  # fmt: skip
        out = {LAUNCH_FILE: (json.dumps(meta, indent=1) + "\n").encode()}
        out |= {f"launch-{i}.ptx": p for i, p in enumerate(self.ptx)}
        return out

    @classmethod
    def from_files(cls, read: Any) -> Launch:
        """The launch :meth:`files` wrote; ``read(name) -> bytes`` reads a file of the artifact.

        Raises:
            ValueError: a malformed ``launch.json``.
        """
        try:
            meta = json.loads(read(LAUNCH_FILE))
            steps: list[Dispatch | Transfer] = []
            for s in meta["steps"]:
                if "dispatch" in s:
                    binds = tuple((b[0], int(b[1])) for b in s["bindings"])
                    steps.append(Dispatch(s["dispatch"], tuple(s["grid"]), binds, tuple(s["constants"])))
                else:
                    kind = "fill" if "fill" in s else "copy"
                    src = tuple(s["source"]) if s.get("source") else None
                    steps.append(Transfer(kind, tuple(s[kind]), s["length"], src, s["pattern"], s["pattern_bytes"]))
            exports = [ExportDef(**(e | {"block": tuple(e["block"])})) for e in meta["exports"]]
            return cls(
                function=meta["function"],
                steps=steps,
                transient=int(meta["transient"]),
                arg_bytes=tuple(meta["arg_bytes"]),
                exports={e.name: e for e in exports},
                ptx=[read(name) for name in meta["ptx"]],
                refused=meta["refused"],
            )
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{LAUNCH_FILE}: malformed: {type(e).__name__}: {e}") from None


class _Refused(Exception):
    """A schedule op or form the direct path does not support."""


# ops that carry no device work (asserts, type constants, fences: stream order replaces fences)
_INERT = {
    "arith.constant", "util.null", "util.global.load", "util.return", "util.status.check_ok",
    "hal.memory_type", "hal.buffer_usage", "hal.element_type", "hal.encoding_type", "hal.buffer_view.assert",
    "hal.buffer.assert", "hal.device.allocator", "hal.fence.create", "hal.fence.await",
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
    maps executable formats to their readers (default: ``cuda-nvptx-fb``; HIP: convbw_mlir.hip_schedule).

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
    memo: dict[str, str] = {}
    for (_, name), op in top.items():
        if name != "util.initializer":
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
        args[a] = f"arg{i}"
        arg_bytes.append(0)
    buffers = dict(args)  # SSA value -> buffer name
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
        elif name == "hal.buffer.assert" and op.operands[0] in buffers:
            b = buffers[op.operands[0]]
            if b.startswith("arg"):
                arg_bytes[int(b[3:])] = max(arg_bytes[int(b[3:])], _const(op.operands[2], "minimum_length"))
        elif name == "hal.device.queue.alloca":
            _flags_zero(op)
            if transient:
                raise _Refused("more than one hal.device.queue.alloca")
            transient = _const(op.operands[7], "the transient's size")
            buffers[op.results[0]] = TRANSIENT
        elif name == "hal.device.queue.dealloca":
            if buffers.get(op.operands[4]) != TRANSIENT:
                raise _Refused("hal.device.queue.dealloca of a buffer that is not the transient")
        elif name == "hal.device.queue.execute.indirect":
            _flags_zero(op)
            # operands: device, affinity, wait, signal, commands, then buffers, offsets, lengths (same variadic size)
            o = list(op.operands)
            n = (len(o) - 5) // 3
            table = [
                (_buffer(buffers, b), _const(off, "a binding offset"))
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
                if _buffer(buffers, v) == TRANSIENT:
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


def _buffer(buffers: dict, value: Any) -> str:
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
    return _buffer(buffers, value), 0


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


def compile_with_launch(bytecode: bytes, target: Any, extra_flags: list[str] | None) -> tuple[bytes, Launch]:
    """Compile to the ``hal`` phase, read the launch schedule there, then continue from ``hal`` to the vmfb
    (one compile, split in two: the vmfb is what a one-shot compile gives).

    Raises:
        CompileError: IREE's diagnostics.
    """
    from convbw_mlir.compiler import compile_module
    from convbw_mlir.ir_imports import ir, new_context

    extra = list(extra_flags or [])
    hal = compile_module(bytecode, target, [*extra, "--compile-to=hal"])
    with new_context() as ctx:
        try:
            launch = read_launch(ir.Module.parse(hal, ctx))
        except Exception as e:  # a reader bug must not fail the compile: IREE's runtime still runs the vmfb
            launch = Launch(refused=f"the schedule reader failed: {type(e).__name__}: {e}")
    vmfb = compile_module(hal, target, [*extra, "--compile-from=hal"])
    return vmfb, launch


# -- running it: the CUDA driver API through ctypes ------------------------------------------------
class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # cuda.h CUfunction_attribute
_LIB: Any = None
_LIB_LOCK = threading.Lock()


def _libcuda() -> Any:
    """``libcuda.so.1`` with the few driver functions the launcher calls (argument types declared)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            lib = ctypes.CDLL("libcuda.so.1")
            vp, u32, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
            pvp = ctypes.POINTER(vp)
            sigs = {
                "cuInit": [u32],
                "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
                "cuDevicePrimaryCtxRetain": [pvp, ctypes.c_int],
                "cuCtxGetCurrent": [pvp],
                "cuCtxSetCurrent": [vp],
                "cuModuleLoadData": [pvp, ctypes.c_char_p],
                "cuModuleGetFunction": [pvp, vp, ctypes.c_char_p],
                "cuFuncSetAttribute": [vp, ctypes.c_int, ctypes.c_int],
                "cuLaunchKernel": [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp],
                "cuMemsetD8Async": [ctypes.c_uint64, ctypes.c_ubyte, sz, vp],
                "cuMemsetD16Async": [ctypes.c_uint64, ctypes.c_ushort, sz, vp],
                "cuMemsetD32Async": [ctypes.c_uint64, u32, sz, vp],
                "cuMemcpyAsync": [ctypes.c_uint64, ctypes.c_uint64, sz, vp],
                "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            }
            for name, args in sigs.items():
                f = getattr(lib, name)
                f.argtypes, f.restype = args, ctypes.c_int
            _check(lib, lib.cuInit(0), "cuInit")
            _LIB = lib
    return _LIB


def _check(lib: Any, rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaError(f"{what}: CUDA error {rc} ({(msg.value or b'?').decode()})")


class CudaLauncher:
    """A :class:`Launch` on one CUDA device: its PTX loaded once, each call a few async driver calls.

    Args:
        launch: a supported schedule (``launch.refused is None``).
        device: the CUDA device ordinal (torch's index).

    Raises:
        ValueError: a refused schedule.
        CudaError: the driver refused the PTX or a kernel.
    """

    def __init__(self, launch: Launch, device: int) -> None:
        if launch.refused:
            raise ValueError(f"launch: refused ({launch.refused})")
        lib = self._lib = _libcuda()
        self.launch, self.device = launch, device
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        # torch's runtime uses the device's primary context: load the kernels into that one
        _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ctx = ctx.value
        self._cur = ctypes.c_void_p()
        self._lock = threading.Lock()  # the kernels' parameter arrays are shared: one call fills them at a time
        self._bind()
        modules = []
        for i, image in enumerate(launch.ptx):
            mod = ctypes.c_void_p()
            _check(lib, lib.cuModuleLoadData(ctypes.byref(mod), image + b"\0"), f"cuModuleLoadData(ptx {i})")
            modules.append(mod)
        self._modules = modules  # never unloaded: a process keeps its kernels (as IREE's executable cache)
        funcs = {}
        for e in launch.exports.values():
            f = ctypes.c_void_p()
            _check(lib, lib.cuModuleGetFunction(ctypes.byref(f), modules[e.module], e.name.encode()),
                   f"cuModuleGetFunction({e.name})")  # fmt: skip
            if e.shared_memory:  # as IREE's native_executable.c: opt in to the dynamic shared memory asked for
                _check(lib, lib.cuFuncSetAttribute(f, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   e.shared_memory), f"cuFuncSetAttribute({e.name})")  # fmt: skip
            funcs[e.name] = f.value
        # per step: a tuple the call loop reads; each kernel's params point into its payload array
        self._plan: list[tuple] = []
        self._params: list[Any] = []
        for s in launch.steps:
            if isinstance(s, Dispatch):
                e = launch.exports[s.kernel]
                n = len(s.bindings) + len(s.constants)
                payload = (ctypes.c_uint64 * max(n, 1))()
                params = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(payload) + 8 * i for i in range(n)])
                for i, c in enumerate(s.constants):  # a 32-bit value in its 8-byte slot (IREE's ABI)
                    payload[len(s.bindings) + i] = c
                self._params.append(params)  # kept alive: the plan holds its address
                binds = [(self._index(b), off) for b, off in s.bindings]
                dims = (*s.grid, *e.block, e.shared_memory)
                self._plan.append(("k", funcs[s.kernel], dims, payload, ctypes.addressof(params), binds))
            else:
                src = (self._index(s.source[0]), s.source[1]) if s.source else None
                self._plan.append((s.kind, (self._index(s.target[0]), s.target[1]), s.length, src,
                                   s.pattern, s.pattern_bytes))  # fmt: skip

    def _index(self, name: str) -> int:
        """The position of buffer ``name`` in the pointer tuple a call passes (args, then the transient)."""
        if name == TRANSIENT:
            return len(self.launch.arg_bytes)
        return int(name[3:])

    def _bind(self) -> None:
        """Make the primary context current on this thread (torch's threads have it already)."""
        cur = self._cur
        self._lib.cuCtxGetCurrent(ctypes.byref(cur))
        if cur.value != self._ctx:
            _check(self._lib, self._lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def __call__(self, pointers: tuple[int, ...], stream: int) -> None:
        """Queue the schedule on ``stream``: ``pointers`` are the arguments' device addresses and the
        transient workspace's (of at least ``launch.transient`` bytes; anything where there is none).

        Raises:
            CudaError: a launch failed (the message names the kernel).
        """
        lib = self._lib
        with self._lock:
            self._bind()
            self._queue(lib, pointers, stream)

    def _queue(self, lib: Any, pointers: tuple[int, ...], stream: int) -> None:
        for step in self._plan:
            if step[0] == "k":
                _, func, dims, payload, params, binds = step
                for i, (which, off) in enumerate(binds):
                    payload[i] = pointers[which] + off
                rc = lib.cuLaunchKernel(func, *dims, stream, params, None)
                if rc:
                    _check(lib, rc, f"cuLaunchKernel({self.launch.steps[self._plan.index(step)].kernel})")
            else:
                kind, (t, toff), length, src, pattern, width = step
                dst = pointers[t] + toff
                if kind == "copy":
                    _check(lib, lib.cuMemcpyAsync(dst, pointers[src[0]] + src[1], length, stream), "cuMemcpyAsync")
                else:
                    fill = {1: lib.cuMemsetD8Async, 2: lib.cuMemsetD16Async, 4: lib.cuMemsetD32Async}[width]
                    _check(lib, fill(dst, pattern, length // width, stream), f"cuMemsetD{8 * width}Async")
