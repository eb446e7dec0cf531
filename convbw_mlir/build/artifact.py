"""A compiled problem: :class:`CompiledOp` (the IR after each stage, the vmfb, how it was made), run
through IREE's runtime, saved to and loaded from an artifact folder.

It loads and runs with only the IREE runtime installed: nothing here imports ``iree.compiler`` at module
level (the ISA report compiles again, in :mod:`convbw_mlir.build.iree`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir import runtime
from convbw_mlir.files import VERSION_RE, read_versioned, write_versioned
from convbw_mlir.plan import Plan, plan_properties
from convbw_mlir.problem import ConvBwdWeightProblem, numpy_dtype
from convbw_mlir.targets import get_target

__all__ = ["CompiledOp"]


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
        dw = self.kernel(device).run(x, dy, *extra).astype(numpy_dtype(self.problem.dw_dtype), copy=False)
        if out is None:
            return dw
        np.copyto(out, dw)
        return out

    def isa_report(self):  # -> convbw_mlir.build.isa.IsaReport
        """The ISA report of this op's kernels (compiles again with IREE's intermediates dumped).

        Raises:
            ValueError: for the host target (no GPU ISA).
        """
        from convbw_mlir.build.iree import executable_intermediates
        from convbw_mlir.build.isa import report

        if not get_target(self.target).is_gpu:
            raise ValueError(f"target: the ISA report is for GPU targets, not {self.target}")
        extra = self.flags[len(get_target(self.target).iree_flags()) :]
        return report(executable_intermediates(self.stages["linalg"], self.target, extra).files, self.target)

    # -- persistence -------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Save into the artifact folder ``directory`` (created if missing); returns ``directory``.

        The folder holds ``op.json`` (the problem, target, pipeline and flags, ``sha256``: each file's hash,
        and ``files``: the name of a ``v-<32 hex>`` subfolder) and that subfolder, which holds ``kernel.vmfb``,
        one ``<stage>.mlir`` per stage and its own ``op.json`` (it loads on its own too).

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
        files = {"kernel.vmfb": bytes(self.vmfb)}
        files |= {f"{stage}.mlir": text.encode() for stage, text in self.stages.items()}
        if self.launch is not None:  # launch.json + PTX beside the vmfb (docs/torch.md)
            files |= self.launch.files()
            meta["launch"] = True
        # checked at load: a corrupt vmfb crashes the runtime that executes it, so it is refused first
        meta["sha256"] = {name: hashlib.sha256(raw).hexdigest() for name, raw in files.items()}
        files["op.json"] = _json_bytes(meta)
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
        Every file is checked against the sha256 ``op.json`` records (a corrupt ``kernel.vmfb`` would crash
        the runtime); an artifact saved before hashes were recorded loads unchecked, with a warning.

        Raises:
            FileNotFoundError: ``directory`` holds no ``op.json``, or a file of the artifact is missing.
            ValueError: a malformed artifact folder, or a file whose hash is not the one recorded (naming it).
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
        read = _checked_reader(directory / "op.json", folder, meta.get("sha256", _UNRECORDED))
        problem = ConvBwdWeightProblem.from_dict(meta["problem"])
        plan = Plan.from_dict(meta["plan"]) if meta.get("plan") else None
        return cls(
            problem=problem,
            target=meta["target"],
            stages={s: read(f"{s}.mlir").decode() for s in meta["stages"]},
            vmfb=read("kernel.vmfb"),
            pipeline=meta["pipeline"],
            flags=list(meta["flags"]),
            iree_version=meta.get("iree_version", ""),
            plan=plan_properties(problem, plan) if plan is not None else None,  # sized for the problem, not stored
            launch=_load_launch(read) if meta.get("launch") else None,
        )


_UNRECORDED = object()  # an op.json without ``sha256``: saved before hashes were recorded


def _checked_reader(index: Path, folder: Path, digests: Any) -> Callable[[str], bytes]:
    """A reader of the artifact's files in ``folder`` that refuses a file whose sha256 is not the one ``index``
    records (or that it does not record); an artifact without hashes is read unchecked, warned once.

    Raises:
        ValueError: ``digests`` is not a dictionary of hex strings (naming ``index``).
    """
    if digests is _UNRECORDED:
        warnings.warn(f"artifact: {index} records no file hashes (saved before they were checked): loaded "
                      "unchecked; save it again to add them", stacklevel=6)  # fmt: skip
        return lambda name: (folder / name).read_bytes()
    if not (isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())):
        raise ValueError(f"artifact: {index}: sha256: expected a dictionary of file names to hex digests")

    def read(name: str) -> bytes:
        raw = (folder / name).read_bytes()
        if digests.get(name) != hashlib.sha256(raw).hexdigest():
            why = "is not recorded in" if name not in digests else "differs from the one recorded in"
            raise ValueError(f"artifact: {folder / name}: its sha256 {why} {index} (a corrupt or altered "
                             "file): not loaded")  # fmt: skip
        return raw

    return read


def _load_launch(read: Callable[[str], bytes]) -> Any:
    from convbw_mlir.cuda_launch import Launch

    return Launch.from_files(read)


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
