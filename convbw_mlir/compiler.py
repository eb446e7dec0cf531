"""compile_op: problem -> convbw op -> target pipeline -> IREE (in process) -> CompiledOp.

``CompiledOp`` loads and runs with only the IREE runtime installed; ``iree.compiler`` is imported
inside :func:`compile_op` and nowhere at module level.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir import runtime
from convbw_mlir.files import atomic_directory
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
    """

    problem: ConvBwdWeightProblem
    target: str
    stages: dict[str, str]
    vmfb: bytes
    pipeline: str
    flags: list[str]
    iree_version: str = ""
    _kernels: dict[Any, runtime.Kernel] = field(default_factory=dict, repr=False, compare=False)

    @property
    def driver(self) -> str:
        return get_target(self.target).driver

    def kernel(self, device: int | None = None) -> runtime.Kernel:
        """The vmfb loaded on device ``device`` of this target's driver (loaded once)."""
        if device not in self._kernels:
            self._kernels[device] = runtime.Kernel(self.vmfb, self.driver, device)
        return self._kernels[device]

    def run(self, x: np.ndarray, dy: np.ndarray, device: int | None = None) -> np.ndarray:
        """Compute dW for ``x`` and ``dy`` (numpy arrays in the problem's layout and type).

        Raises:
            TypeError / ValueError: arrays of the wrong dtype or shape.
            runtime.DeviceError: no device for the target's driver.
        """
        x, dy = runtime.check_inputs(self.problem, x, dy)
        return self.kernel(device).run(x, dy).astype(runtime.numpy_dtype(self.problem.dw_dtype), copy=False)

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
        """Write ``op.json``, ``kernel.vmfb`` and one ``<stage>.mlir`` per stage into ``directory``.

        The files are written to a temporary folder beside it and moved into place at the end, so an
        interrupted save leaves nothing half-written.
        """
        with atomic_directory(directory) as tmp:
            (tmp / "kernel.vmfb").write_bytes(self.vmfb)
            for stage, text in self.stages.items():
                (tmp / f"{stage}.mlir").write_text(text)
            meta = {
                "problem": self.problem.to_dict(),
                "target": self.target,
                "pipeline": self.pipeline,
                "flags": self.flags,
                "stages": list(self.stages),
                "iree_version": self.iree_version,
            }
            (tmp / "op.json").write_text(json.dumps(meta, indent=1) + "\n")
        return Path(directory)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CompiledOp:
        """Read what :meth:`save` wrote (needs only the IREE runtime).

        Raises:
            FileNotFoundError / ValueError: a missing or malformed artifact folder.
        """
        directory = Path(directory)
        meta_path = directory / "op.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"artifact: {meta_path} does not exist (not a saved CompiledOp)")
        try:
            meta = json.loads(meta_path.read_text())
            problem = ConvBwdWeightProblem.from_dict(meta["problem"])
            stages = {s: (directory / f"{s}.mlir").read_text() for s in meta["stages"]}
            return cls(
                problem=problem,
                target=meta["target"],
                stages=stages,
                vmfb=(directory / "kernel.vmfb").read_bytes(),
                pipeline=meta["pipeline"],
                flags=list(meta["flags"]),
                iree_version=meta.get("iree_version", ""),
            )
        except (KeyError, json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"artifact: {meta_path} is malformed: {e}") from None


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


def compile_module(module_text: str | bytes, target: Target | str, extra_flags: list[str] | None = None) -> bytes:
    """Compile MLIR (text or bytecode of linalg on tensors) to a vmfb in process through iree.compiler.api.

    Raises:
        CompileError: IREE's diagnostics.
    """
    from iree.compiler import api

    target = get_target(target) if isinstance(target, str) else target
    session = api.Session()
    flags = target.iree_flags() + list(extra_flags or [])
    try:
        session.set_flags(*flags)
    except Exception as e:
        raise CompileError(f"flags: {e}") from None
    inv = session.invocation()
    with _collect_diagnostics(session.context) as diags:
        source = api.Source.wrap_buffer(session, module_text.encode() if isinstance(module_text, str) else module_text)
        if not inv.parse_source(source) or not inv.execute():
            raise CompileError("\n".join(diags) or f"IREE failed to compile for {target.name}")
        out = api.Output.open_membuffer()
        inv.output_vm_bytecode(out)
        return bytes(out.map_memory())


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
    **options: Any,
) -> CompiledOp:
    """Compile ``problem`` for ``target`` through the target's pipeline and IREE.

    Args:
        problem: the problem.
        target: ``host``, an AMD ``gfx*`` or an NVIDIA ``sm_*`` name (see :data:`convbw_mlir.targets.TARGETS`).
        extra_flags: more IREE compiler flags.
        **options: pass options for the target pipeline (see :func:`convbw_mlir.pipelines.for_target`).

    Raises:
        ValueError: unknown target or option.
        CompileError: a pass or IREE failed.
    """
    import iree.compiler

    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.passes import format_pipeline
    from convbw_mlir.pipelines import for_target

    tgt = get_target(target)
    pipeline = for_target(target, **options)
    with new_context() as ctx:
        module = convbw.build_module(problem)
        stages = {"convbw": str(module)}
        run_pipeline(module, pipeline, ctx)
        stages["linalg"] = str(module)
        bytecode = _bytecode(module)
    vmfb = compile_module(bytecode, tgt, extra_flags)
    return CompiledOp(
        problem=problem,
        target=target,
        stages=stages,
        vmfb=vmfb,
        pipeline=format_pipeline(pipeline),
        flags=tgt.iree_flags() + list(extra_flags or []),
        iree_version=getattr(iree.compiler, "__version__", "") or _iree_version(),
    )


def _bytecode(module: Any) -> bytes:
    import io

    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return buf.getvalue()


def _iree_version() -> str:
    from importlib.metadata import version

    return version("iree-base-compiler")
