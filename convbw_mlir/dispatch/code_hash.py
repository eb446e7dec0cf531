"""A hash of the product's own code that shapes a kernel, for the kernel cache key.

The key of a cached kernel (:func:`convbw_mlir.dispatch.variants.variant_key`) names the problem, target,
plan, flags and IREE's version; this adds the source of the modules whose edit changes what a kernel is
(builders, passes, kernels, dialects, the plan, pipelines, targets, the contraction ...), so that an
upgrade without a version bump, or a developer's edit, never serves a kernel built by other code. The
tuning database is not keyed by it: it stores plans, which are checked again when used.

Files are found through the import system (``importlib.util.find_spec``), so the hash is the same for an
editable checkout and an installed wheel of the same code: each file is named by its module, not its path.
Computed once per process (a few ms); importing nothing from the compiler.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path

__all__ = ["KERNEL_MODULES", "KERNEL_PACKAGES", "code_hash", "hash_sources", "kernel_sources"]

# Packages whose every module shapes a kernel's IR: the builders, passes and dialect, the kernel policies
# (tiling and split rules), and the build (pipeline, IREE's flags and forms, the CUDA schedule, what an entry stores).
KERNEL_PACKAGES = (
    "convbw_mlir.kernels",
    "convbw_mlir.passes",
    "convbw_mlir.dialects",
    "convbw_mlir.policies",
    "convbw_mlir.build",
)
# Modules that shape a kernel: its IR, its plan, the IREE flags and forms it is compiled with, what an entry stores.
KERNEL_MODULES = (
    "convbw_mlir.builders",
    "convbw_mlir.contraction",
    "convbw_mlir.loops",
    "convbw_mlir.pipelines",
    "convbw_mlir.targets",
    "convbw_mlir.plan",
    "convbw_mlir.plan_data",
    "convbw_mlir.problem",
    "convbw_mlir.formats",
    "convbw_mlir.epilogues",
    "convbw_mlir.ir_imports",
    "convbw_mlir.cuda_launch",
)


def kernel_sources() -> list[tuple[str, Path]]:
    """``(name, file)`` of every source file that shapes a kernel; ``name`` is the module's, path-free.

    Raises:
        ImportError: a listed module or package is not installed (a broken install).
    """
    out = []
    for package in KERNEL_PACKAGES:
        spec = importlib.util.find_spec(package)  # imports the parent package only, not this one
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"code hash: package {package} not found")
        for folder in spec.submodule_search_locations:
            root = Path(folder)
            out += [(f"{package}/{f.relative_to(root).as_posix()}", f) for f in root.rglob("*.py")]
    for module in KERNEL_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ImportError(f"code hash: module {module} not found")
        out.append((module, Path(spec.origin)))
    return sorted(out)


def hash_sources(sources: Iterable[tuple[str, Path]]) -> str:
    """sha256 over each ``(name, file)``'s name and bytes, in order."""
    h = hashlib.sha256()
    for name, path in sources:
        raw = path.read_bytes()
        h.update(f"{name}\0{len(raw)}\0".encode())
        h.update(raw)
    return h.hexdigest()


@functools.cache
def code_hash() -> str:
    """The hash of :func:`kernel_sources`, once per process."""
    return hash_sources(kernel_sources())
