"""IREE's compiler, in process: MLIR (text or bytecode) to a vmfb through ``iree.compiler.api``, with its
diagnostics as lines, and its dumped executable intermediates (ISA, LLVM IR, configured executables).

``iree.compiler`` is imported inside the functions, never at module level.
"""

from __future__ import annotations

import ctypes
import io
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convbw_mlir.targets import Target, get_target, resolve

__all__ = [
    "CompileError",
    "Intermediates",
    "compile_module",
    "device_allocations",
    "executable_intermediates",
    "iree_version",
]


class CompileError(RuntimeError):
    """A pass or IREE failed; the message holds MLIR's diagnostics (with locations)."""


def compile_module(
    module_text: str | bytes,
    target: Target | str,
    extra_flags: list[str] | None = None,
    source_name: str = "source.mlir",
) -> bytes:
    """Compile MLIR (text or bytecode of linalg on tensors) to a vmfb in process through iree.compiler.api.

    IREE crashes the process on some inputs (unregistered ops, some LLVM aborts): run this through
    :func:`convbw_mlir.build.isolate.call` where the input is not trusted.

    Args:
        module_text: the module, MLIR text or bytecode.
        target: a target name or :class:`Target`.
        extra_flags: more IREE compiler flags; ``--compile-to=PHASE`` (then the result is MLIR bytecode of
            that phase) and ``--compile-from=PHASE`` as iree-compile takes them.
        source_name: the file name IREE's diagnostics give as location.

    Raises:
        CompileError: IREE's diagnostics.
    """
    from iree.compiler import api

    from convbw_mlir.build import cubin

    target = resolve(target)
    flags = target.iree_flags() + list(extra_flags or [])
    # the phase options are iree-compile's, not the session's: the invocation takes them (embedding_api.h)
    is_phase = ("--compile-to=", "--compile-from=")
    phases = {f[2:].split("=")[0]: f.split("=", 1)[1] for f in flags if f.startswith(is_phase)}
    if not phases and target.driver == "cuda" and cubin.requested():  # opt-in cubins (build/cubin.py): at hal
        ptxas = cubin.ptxas()  # none: one error before IREE runs
        hal = compile_module(module_text, target, [*(extra_flags or []), "--compile-to=hal"], source_name)
        try:
            hal = cubin.assemble_hal(hal, target, ptxas)
        except cubin.PtxasError as e:
            raise CompileError(str(e)) from None
        return compile_module(hal, target, [*(extra_flags or []), "--compile-from=hal"], source_name)
    session = api.Session()
    flags = [f for f in flags if not f.startswith(is_phase)]
    try:
        session.set_flags(*flags)
    except Exception as e:
        raise CompileError(f"flags: {e}") from None
    if target.target_info and "compile-from" not in phases:
        module_text = _with_device_targets(module_text, target)
    inv = session.invocation()
    for phase, value in phases.items():
        from iree.compiler.api import ctypes_dl

        setter = getattr(ctypes_dl._dylib, f"ireeCompilerInvocationSetCompile{phase[8:].title()}Phase")
        setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_char_p], None
        setter(inv._inv_p, value.encode())
    with _iree_diagnostics(inv) as diags:
        data = module_text.encode() if isinstance(module_text, str) else module_text
        source = api.Source.wrap_buffer(session, data, buffer_name=source_name)
        if not inv.parse_source(source) or not inv.execute():
            raise CompileError("\n".join(diags) or f"IREE failed to compile for {target.name}")
        out = api.Output.open_membuffer()
        inv.output_ir_bytecode(out) if "compile-to" in phases else inv.output_vm_bytecode(out)
        return bytes(out.map_memory())


def _with_device_targets(module_text: str | bytes, target: Target) -> bytes:
    """``module_text`` with the hand-written ``hal.device.targets`` of ``target`` (a chip IREE 3.13 has no
    flag value for, e.g. sm_90a), as bytecode; a module that already names its targets is kept as is."""
    from convbw_mlir.ir_imports import ir, new_context

    with new_context() as ctx:
        module = ir.Module.parse(module_text, ctx)
        attrs = module.operation.attributes
        if "hal.device.targets" not in attrs:
            attrs["hal.device.targets"] = ir.Attribute.parse(target.device_targets())
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()


_SEVERITY = {0: "note", 1: "warning", 2: "error", 3: "remark"}  # embedding_api.h: iree_compiler_diagnostic_severity_t
_FILE_LOC = re.compile(r"^(\S+:\d+:\d+): (.*)$", re.S)


def _split_location(text: str) -> tuple[str, str]:
    """``("file:1:2", message)`` or ``("loc(...)", message)`` from IREE's "loc: message"; ``("", text)``."""
    if m := _FILE_LOC.match(text):
        return m.group(1), m.group(2)
    if text.startswith("loc("):
        depth, quoted = 0, False
        for i, ch in enumerate(text):
            quoted = quoted != (ch == '"')
            depth += 0 if quoted else (ch == "(") - (ch == ")")
            if depth == 0 and not quoted and text[i + 1 : i + 3] == ": ":
                return text[: i + 1], text[i + 3 :]
    return "", text


class _iree_diagnostics:  # noqa: N801 - used as a context manager, reads like a function
    """Capture an IREE invocation's diagnostics as ``loc: severity: message`` lines.

    IREE calls a context's diagnostic handler from its worker threads and from inside ctypes calls
    that released the GIL; an MLIR-bindings handler then aborts the interpreter ("PyThreadState_Get:
    the GIL is released"). A ctypes callback takes the GIL itself, so IREE's C callback API is used.
    The invocation is closed on exit, while the callback is still alive.
    """

    def __init__(self, inv: Any) -> None:
        self.inv = inv
        self.lines: list[str] = []

    def _add(self, severity: int, message: int, size: int, _user: int) -> None:
        # IREE formats a diagnostic as "loc: message", its notes as further paragraphs.
        text = ctypes.string_at(message, size).decode(errors="replace")
        sev = _SEVERITY.get(severity, "error")
        for i, para in enumerate(p.strip() for p in text.split("\n\n") if p.strip()):
            loc, message = _split_location(para)
            self.lines.append(f"{loc}: {sev if i == 0 else 'note'}: {message}" if loc else f"{sev}: {message}")

    def __enter__(self) -> list[str]:
        from iree.compiler.api import ctypes_dl

        callback_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        enable = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, callback_t, ctypes.c_void_p)(
            ("ireeCompilerInvocationEnableCallbackDiagnostics", ctypes_dl._dylib)
        )
        self._callback = callback_t(self._add)
        enable(self.inv._inv_p, 0, self._callback, None)
        return self.lines

    def __exit__(self, *exc: Any) -> None:
        self.inv.close()  # IREE may still report while the invocation lives: close it first
        self._callback = None


@dataclass
class Intermediates:
    """IREE's dumped executable intermediates of one compile (ISA, LLVM IR, and the configured
    executables ``configured_*.mlir``), by file name."""

    target: str
    files: dict[str, str]
    vmfb: bytes = b""

    @property
    def isa(self) -> str:
        """The machine-level text: the dumped files named by the target's ``isa_suffix``."""
        suffix = get_target(self.target).isa_suffix
        texts = [t for name, t in sorted(self.files.items()) if name.endswith(suffix)]
        if not texts:
            raise CompileError(f"isa: IREE dumped no *{suffix} file for {self.target} (got {sorted(self.files)})")
        return "\n".join(texts)


def executable_intermediates(
    module_text: str | bytes, target: str, extra_flags: list[str] | None = None
) -> Intermediates:
    """Compile and return IREE's dumped executable intermediates (ISA text, LLVM IR).

    Raises:
        CompileError: IREE's diagnostics.
    """
    with tempfile.TemporaryDirectory(prefix="convbw-dump-") as d:
        # the configured executables too: which lowering_config each kernel was compiled with
        flags = [f"--iree-hal-dump-executable-intermediates-to={d}",
                 f"--iree-hal-dump-executable-configurations-to={d}", *(extra_flags or [])]  # fmt: skip
        vmfb = compile_module(module_text, target, flags)
        files = {}
        for path in sorted(Path(d).iterdir()):
            if path.suffix in (".ll", ".rocmasm", ".s") or path.name.startswith("configured_"):
                files[path.name] = path.read_text(errors="replace")
    return Intermediates(target, files, vmfb)


# stream.resource.alloca / alloc of a static size, as IREE 3.13 prints them: the lifetime and the size (a
# constant's SSA name, or a literal)
_ALLOC = re.compile(r"stream\.resource\.alloca?\b[^\n]*?!stream\.resource<(\w+)>\{(%?[\w]+)\}")
_INDEX_CONST = re.compile(r"(%c\w*) = arith\.constant (\d+) : index")


def device_allocations(module: str | bytes, target: Target | str, extra_flags: list[str] | None = None) -> dict:
    """Bytes IREE allocates for one call of ``module`` (a lowered module, text or bytecode), by buffer
    lifetime (``external``: the results; ``transient``: scratch of the call; ``constant``: kept by the
    module), read from its stream phase (``--compile-to=stream``, ~0.2-1 s): what a plan's
    ``workspace_bytes`` is checked against.

    Raises:
        CompileError: IREE's diagnostics; a size that is not a constant (a dynamic shape: none of ours).
    """
    from iree.compiler import ir

    data = compile_module(module, target, [*(extra_flags or []), "--compile-to=stream"])
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        text = str(ir.Module.parse(data))
    consts = dict(_INDEX_CONST.findall(text))
    out: dict[str, int] = {}
    for lifetime, size in _ALLOC.findall(text):
        value = consts.get(size, size)
        if not value.isdigit():
            raise CompileError(f"allocations: a {lifetime} buffer of dynamic size {size}")
        out[lifetime] = out.get(lifetime, 0) + int(value)
    return out


def iree_version() -> str:
    from importlib.metadata import version

    return version("iree-base-compiler")
