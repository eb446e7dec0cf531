"""compile_op: problem -> convbw op -> target pipeline -> IREE (in process) -> CompiledOp.

``CompiledOp`` loads and runs with only the IREE runtime installed; ``iree.compiler`` is imported
inside :func:`compile_op` and nowhere at module level.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir import runtime
from convbw_mlir.files import VERSION_RE, read_versioned, write_versioned
from convbw_mlir.limits import check_limits
from convbw_mlir.plan import Plan, PlanError, check_plan
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, get_target

__all__ = [
    "CompileError",
    "CompiledOp",
    "Intermediates",
    "compile_module",
    "compile_op",
    "executable_intermediates",
    "lowered_text",
    "run_pipeline",
]


class CompileError(RuntimeError):
    """A pass or IREE failed; the message holds MLIR's diagnostics (with locations)."""


@dataclass
class CompiledOp:
    """A compiled problem: the IR after each stage, the vmfb and how it was made.

    Attributes:
        problem: what it computes.
        target: the target name.
        stages: IR text by stage name, in order (``convbw``: the op; ``linalg``: after the pipeline).
        vmfb: the IREE VM flatbuffer.
        pipeline: the replayable convbw pipeline string.
        flags: the IREE compiler flags used.
        iree_version: the IREE compiler's version.
        plan: the :class:`convbw_mlir.plan.Plan` the pipeline carried out (None for artifacts saved
            before plans existed).
    """

    problem: ConvBwdWeightProblem
    target: str
    stages: dict[str, str]
    vmfb: bytes
    pipeline: str
    flags: list[str]
    iree_version: str = ""
    plan: Plan | None = None
    selection: Any = field(default=None, compare=False)  # convbw_mlir.dispatch.Selection: who chose the variant
    # convbw_mlir.cuda_launch.Launch: a CUDA target's schedule + PTX for the direct launch (derived from the vmfb)
    launch: Any = field(default=None, compare=False)
    _kernels: dict[Any, runtime.Kernel] = field(default_factory=dict, repr=False, compare=False)

    @property
    def driver(self) -> str:
        return get_target(self.target).driver

    def kernel(self, device: int | None = None) -> runtime.Kernel:
        """The vmfb loaded on device ``device`` of this target's driver (loaded once).

        Raises:
            TypeError / ValueError: ``device`` is not None or an int >= 0.
        """
        device = _device_index(device)
        if device not in self._kernels:
            self._kernels[device] = runtime.Kernel(self.vmfb, self.driver, device)
        return self._kernels[device]

    def run(
        self,
        x: np.ndarray,
        dy: np.ndarray,
        d: np.ndarray | None = None,
        out: np.ndarray | None = None,
        device: int | None = None,
    ) -> np.ndarray:
        """Compute dW for ``x`` and ``dy`` (numpy arrays in the problem's layout and type).

        Args:
            d: the bilinear epilogue's D (dW's layout and shape, the epilogue's D type); only for an
                op compiled with a bilinear epilogue.
            out: where dW goes (dW's shape and type). The accumulate epilogue needs it: its current
                contents are D and the result replaces them (``out = alpha * x * dy + beta * out``).
                Otherwise optional: the result is written into it and it is returned.
            device: the index of the device among the driver's devices (None: the first); the CPU
                driver has one device, whatever the index.

        Every argument is checked before anything runs: on an error the caller's ``d`` and ``out`` are
        untouched.

        Raises:
            TypeError / ValueError: arrays of the wrong dtype or shape, a ``d`` or ``out`` that the op's
                epilogue does not take (or a missing one), or a ``device`` that is not None or an int >= 0.
            runtime.DeviceError: no device for the target's driver.
        """
        from convbw_mlir.epilogues import check_epilogue_arrays

        device = _device_index(device)
        x, dy = runtime.check_inputs(self.problem, x, dy, driver=self.driver)
        extra = check_epilogue_arrays(self.problem, d, out)
        dw = self.kernel(device).run(x, dy, *extra).astype(runtime.numpy_dtype(self.problem.dw_dtype), copy=False)
        if out is None:
            return dw
        np.copyto(out, dw)
        return out

    def isa_report(self):  # -> convbw_mlir.isa.IsaReport
        """The ISA report of this op's kernels (compiles again with IREE's intermediates dumped).

        Raises:
            ValueError: for the host target (no GPU ISA).
        """
        from convbw_mlir.isa import report

        if not get_target(self.target).is_gpu:
            raise ValueError(f"target: the ISA report is for GPU targets, not {self.target}")
        extra = self.flags[len(get_target(self.target).iree_flags()) :]
        return report(executable_intermediates(self.stages["linalg"], self.target, extra).files, self.target)

    # -- persistence -------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Save into the artifact folder ``directory`` (created if missing); returns ``directory``.

        The folder holds ``op.json`` (the problem, target, pipeline and flags, and ``files``: the name of
        a ``v-<32 hex>`` subfolder) and that subfolder, which holds ``kernel.vmfb``, one ``<stage>.mlir``
        per stage and its own ``op.json`` (it loads on its own too).

        Promises:
            - Save writes and removes only its own files; a folder holding anything else (or an
              ``op.json`` that is not a CompiledOp's) is refused before anything is written there.
            - Replacing an earlier artifact (of this layout or the older flat one) is atomic: a load
              sees the old artifact or the new one, whole; a save that fails or is killed leaves the old.
            - Concurrent saves into one folder, from threads or processes, all succeed: the last wins.
            - Folders and files get the usual permissions (0777 / 0666 less the umask).

        Raises:
            ValueError: ``directory`` holds something that no save wrote (the message names the folder
                and one such entry), or is not a folder.
        """
        meta = {
            "problem": self.problem.to_dict(),
            "target": self.target,
            "pipeline": self.pipeline,
            "flags": self.flags,
            "stages": list(self.stages),
            "iree_version": self.iree_version,
        }
        if self.plan is not None:
            meta["plan"] = self.plan.to_dict()
        files = {"kernel.vmfb": bytes(self.vmfb), "op.json": _json_bytes(meta)}
        files |= {f"{stage}.mlir": text.encode() for stage, text in self.stages.items()}
        if self.launch is not None:  # launch.json + PTX beside the vmfb (docs/torch.md)
            files |= self.launch.files()
            meta["launch"] = True
        write_versioned(
            directory,
            files,
            "op.json",
            index=lambda version: _json_bytes({**meta, "files": version}),
            legacy_names=_flat_layout_names,
        )
        return Path(directory)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CompiledOp:
        """Read what :meth:`save` wrote (needs only the IREE runtime); also reads the older flat layout
        (``op.json``, ``kernel.vmfb`` and the ``.mlir`` files side by side).

        An artifact is native code that :meth:`run` executes: load only artifacts from a trusted source.
        A load concurrent with saves into the same folder returns one complete artifact, never a mix.

        Raises:
            FileNotFoundError: ``directory`` holds no ``op.json``, or a file of the artifact is missing.
            ValueError: a malformed artifact folder.
        """
        directory = Path(directory)
        meta_path = directory / "op.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"artifact: {meta_path} does not exist (not a saved CompiledOp)")
        try:
            return read_versioned(directory, "op.json", lambda raw: cls._from_files(directory, raw))
        except FileNotFoundError as e:
            raise FileNotFoundError(f"artifact: {e.filename} does not exist ({directory} is incomplete)") from None
        except (KeyError, json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"artifact: {meta_path} is malformed: {type(e).__name__}: {e}") from None

    @classmethod
    def _from_files(cls, directory: Path, raw: bytes) -> CompiledOp:
        """The op whose ``op.json`` holds ``raw``; its files are in ``directory`` or the version it names."""
        meta = json.loads(raw)
        folder = directory
        if "files" in meta:
            if not isinstance(meta["files"], str) or not VERSION_RE.fullmatch(meta["files"]):
                raise ValueError(
                    f"artifact: {directory / 'op.json'}: files: expected v-<32 hex>, got {meta['files']!r}"
                )
            folder = directory / meta["files"]
        return cls(
            problem=ConvBwdWeightProblem.from_dict(meta["problem"]),
            target=meta["target"],
            stages={s: (folder / f"{s}.mlir").read_text() for s in meta["stages"]},
            vmfb=(folder / "kernel.vmfb").read_bytes(),
            pipeline=meta["pipeline"],
            flags=list(meta["flags"]),
            iree_version=meta.get("iree_version", ""),
            plan=Plan.from_dict(meta["plan"]) if meta.get("plan") else None,
            launch=_load_launch(folder) if meta.get("launch") else None,
        )


def _load_launch(folder: Path) -> Any:
    from convbw_mlir.cuda_launch import Launch

    return Launch.from_files(lambda name: (folder / name).read_bytes())


def _device_index(device: Any) -> int | None:
    """``device`` checked: None or an int >= 0 (numpy ints too, as an int)."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, int | np.integer):
        raise TypeError(f"device: expected a device index (an int >= 0) or None, got {device!r}")
    if device < 0:
        raise ValueError(f"device: expected a device index (an int >= 0) or None, got {device}")
    return int(device)


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=1) + "\n").encode()


def _flat_layout_names(raw: bytes) -> list[str]:
    """The files of the flat layout that the ``op.json`` holding ``raw`` describes (none for a versioned one).

    Raises:
        ValueError: ``raw`` is not a CompiledOp's ``op.json``.
    """
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict) or not {"problem", "target", "stages"} <= meta.keys():
            raise ValueError("not a CompiledOp's op.json")
        if "files" in meta:
            return []
        return ["kernel.vmfb", *(f"{s}.mlir" for s in meta["stages"] if isinstance(s, str) and "/" not in s)]
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as e:
        raise ValueError(f"not a CompiledOp's op.json: {e}") from None


def run_pipeline(module: Any, pipeline: list, context: Any = None) -> None:
    """Run a parsed pipeline on ``module`` in place.

    Raises:
        CompileError: with MLIR's diagnostics when a pass fails.
    """
    from convbw_mlir.passes import build_pass_manager

    pm = build_pass_manager(pipeline, context or module.context)
    with _collect_diagnostics(module.context) as diags:
        try:
            pm.run(module.operation)
        except Exception as e:
            # An MLIRError carries its diagnostics itself; others went to our handler.
            for d in getattr(e, "error_diagnostics", []):
                diags.append(f"{d.location}: error: {d.message}")
                diags.extend(f"{n.location}: note: {n.message}" for n in d.notes)
            raise CompileError("\n".join(diags) or str(e)) from None


def lowered_text(problem: ConvBwdWeightProblem, pipeline: list) -> str:
    """The IR text of ``problem``'s convbw op after ``pipeline`` (a parsed pipeline, e.g. from
    :func:`convbw_mlir.pipelines.for_target`), in a context of its own.

    Raises:
        CompileError: a pass failed.
    """
    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import new_context

    with new_context() as ctx:
        module = convbw.build_module(problem)
        run_pipeline(module, pipeline, ctx)
        return str(module)


class _collect_diagnostics:  # noqa: N801 - used as a context manager, reads like a function
    """Capture the diagnostics emitted in ``context`` as ``loc: severity: message`` lines."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.lines: list[str] = []

    def __enter__(self) -> list[str]:
        def handler(d: Any) -> bool:
            sev = str(d.severity).rsplit(".", 1)[-1].lower()
            self.lines.append(f"{d.location}: {sev}: {d.message}")
            for note in d.notes:
                self.lines.append(f"{note.location}: note: {note.message}")
            return True

        self._handler = self.context.attach_diagnostic_handler(handler)
        return self.lines

    def __exit__(self, *exc: Any) -> None:
        self._handler.detach()


def compile_module(
    module_text: str | bytes,
    target: Target | str,
    extra_flags: list[str] | None = None,
    source_name: str = "source.mlir",
) -> bytes:
    """Compile MLIR (text or bytecode of linalg on tensors) to a vmfb in process through iree.compiler.api.

    IREE crashes the process on some inputs (unregistered ops, some LLVM aborts): run this through
    :func:`convbw_mlir.isolate.call` where the input is not trusted.

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

    target = get_target(target) if isinstance(target, str) else target
    session = api.Session()
    flags = target.iree_flags() + list(extra_flags or [])
    # the phase options are iree-compile's, not the session's: the invocation takes them (embedding_api.h)
    is_phase = ("--compile-to=", "--compile-from=")
    phases = {f[2:].split("=")[0]: f.split("=", 1)[1] for f in flags if f.startswith(is_phase)}
    flags = [f for f in flags if not f.startswith(is_phase)]
    try:
        session.set_flags(*flags)
    except Exception as e:
        raise CompileError(f"flags: {e}") from None
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


def compile_op(
    problem: ConvBwdWeightProblem,
    target: str = "host",
    extra_flags: list[str] | None = None,
    *,
    plan: Plan | dict[str, Any] | None = None,
    isolate: bool = False,
    timeout: float | None = None,
    output_arg: bool = False,
    cache: Any = None,
    **options: Any,
) -> CompiledOp:
    """Compile ``problem`` for ``target`` through the target's pipeline and IREE.

    Args:
        problem: the problem.
        target: ``host``, an AMD ``gfx*`` or an NVIDIA ``sm_*`` name (see :data:`convbw_mlir.targets.TARGETS`).
        extra_flags: more IREE compiler flags.
        plan: a plan to carry out as it is (e.g. one a tuner stored, or its dictionary) instead of
            deciding one; it must be for ``target`` and takes no ``options``.
        isolate: compile in a child process (:mod:`convbw_mlir.isolate`), so that an IREE crash raises
            :class:`CompileError` here instead of ending this process (a cache hit starts no child).
        timeout: with ``isolate``, seconds before the child is killed (None: no limit).
        output_arg: give the function a third argument, the buffer dW is written into
            (``{iree.abi.output = 0}``): the caller owns the output (:class:`convbw_mlir.runtime.PreparedCall`).
            Cached apart from the same kernel without it.
        cache: the kernel cache (:class:`convbw_mlir.dispatch.KernelCache` or its folder; None: the user's,
            ``$CONVBW_CACHE_DIR`` or the platform's cache folder); False compiles without it. With no
            ``plan`` and no ``options``, :func:`convbw_mlir.dispatch.select` picks the variant (a tuned
            one where a tuning database has it); ``op.selection`` says which path chose it.
        **options: pass options for the target pipeline (see :func:`convbw_mlir.pipelines.for_target`).

    Raises:
        ValueError: unknown target or option.
        CompileError: a pass or IREE failed; with ``isolate``, also IREE crashed or timed out
            (:class:`convbw_mlir.isolate.CompilerCrash`).
    """
    if timeout is not None and not isolate:
        raise ValueError("timeout: applies to isolate=True compiles only")
    tgt = get_target(target)  # a bad name is the caller's ValueError, before a child starts
    check_limits(problem, tgt)
    if isinstance(plan, dict):  # a stored plan's plain data (as Plan.to_dict writes it)
        plan = Plan.from_dict(plan)
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a Plan, its dictionary or None, got {plan!r}")
    if plan is not None and (options or plan.target != target):
        why = f"options {', '.join(options)} given too" if options else f"it is for {plan.target}"
        raise PlanError(f"plan: a given plan is carried out as it is, for its own target; here {why}")
    if plan is not None:
        check_plan(problem, plan)
    if cache is not False:  # through the kernel cache and select (convbw_mlir/dispatch/); a miss may isolate
        from convbw_mlir.dispatch.hooks import compile_cached

        return compile_cached(problem, target, extra_flags, plan, options, cache, output_arg=output_arg,
                              isolate=isolate, timeout=timeout)  # fmt: skip
    if isolate:
        from convbw_mlir.isolate import call

        kw = {"output_arg": True} if output_arg else {}
        return call(compile_op, problem, target, extra_flags, plan=plan, what=f"{problem.name} for {target}",
                    timeout=timeout, cache=False, **kw, **options)  # fmt: skip
    import iree.compiler

    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.passes import format_pipeline
    from convbw_mlir.pipelines import for_target

    pipeline = for_target(target, **options)
    with new_context() as ctx:
        module = convbw.build_module(problem, plan)
        stages = {"convbw": str(module)}
        run_pipeline(module, pipeline, ctx)
        if output_arg:
            _add_output_arg(module)
        stages["linalg"] = str(module)
        bytecode = _bytecode(module)
        plan = _plan_carried_out(module)
    vmfb, launch = _compile_vmfb(bytecode, tgt, extra_flags)
    return CompiledOp(
        problem=problem,
        target=target,
        stages=stages,
        vmfb=vmfb,
        pipeline=format_pipeline(pipeline),
        flags=tgt.iree_flags() + list(extra_flags or []),
        iree_version=getattr(iree.compiler, "__version__", "") or _iree_version(),
        plan=plan,
        launch=launch,
    )


def _compile_vmfb(bytecode: bytes, tgt: Target, extra_flags: list[str] | None) -> tuple[bytes, Any]:
    """The vmfb and, for CUDA targets, the direct launch's schedule read at the ``hal`` phase of the same compile."""
    if tgt.driver == "cuda":
        from convbw_mlir.cuda_launch import compile_with_launch

        return compile_with_launch(bytecode, tgt, extra_flags)
    return compile_module(bytecode, tgt, extra_flags), None


def _add_output_arg(module: Any) -> None:
    """Append ``%out: !hal.buffer {iree.abi.output = 0 : index}`` to the entry function: IREE then
    writes result 0 into that caller-owned buffer instead of allocating one per call (iree-org/iree#17012)."""
    from convbw_mlir.dialects.convbw import FUNC_NAME
    from convbw_mlir.ir_imports import ir

    (fn,) = [op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == FUNC_NAME]
    with module.context, ir.Location.unknown():
        buffer_t = ir.Type.parse("!hal.buffer")
        fn.regions[0].blocks[0].add_argument(buffer_t, ir.Location.unknown())
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([*ftype.inputs, buffer_t], list(ftype.results))
        )
        old = list(ir.ArrayAttr(fn.attributes["arg_attrs"])) if "arg_attrs" in fn.attributes else []
        old += [ir.DictAttr.get({})] * (len(ftype.inputs) - len(old))
        tie = ir.DictAttr.get({"iree.abi.output": ir.IntegerAttr.get(ir.IndexType.get(), 0)})
        fn.attributes["arg_attrs"] = ir.ArrayAttr.get([*old, tie])


def with_output_arg(text: str) -> str:
    """``text`` (a module whose entry function is ``conv_bwd_weight(x, dy) -> dW``) with the caller-owned
    output argument of :func:`_add_output_arg`: IREE's own forms get the same ABI as ours."""
    from convbw_mlir.ir_imports import ir, new_context

    with new_context():
        module = ir.Module.parse(text)
        _add_output_arg(module)
        return str(module)


def _plan_carried_out(module: Any) -> Plan | None:
    """The plan the lowered module's contraction records (one contraction per problem)."""
    from convbw_mlir.contraction import Contraction, contractions

    found = [Contraction.of_op(op).plan for op in contractions(module.operation)]
    if not found:  # an explicit kernel has no contraction; its dispatch carries the plan
        from convbw_mlir.passes.explicit_kernel import carried_plan

        return carried_plan(module)
    return Plan.from_dict(found[0]) if found and found[0] else None


def _bytecode(module: Any) -> bytes:
    import io

    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return buf.getvalue()


def _iree_version() -> str:
    from importlib.metadata import version

    return version("iree-base-compiler")
