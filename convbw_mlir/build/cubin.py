"""Ahead-of-time cubins for the CUDA targets (opt-in: ``CONVBW_PTXAS``), so that no driver JIT runs at load.

Every CUDA kernel we ship is PTX by default: IREE's CUDA runtime and the direct launch
(:mod:`convbw_mlir.cuda_launch`) hand it to ``cuModuleLoadData``, and the driver runs ptxas on it at load (once a
machine, where its ComputeCache is kept; every load where it is not). IREE 3.13 registers
``--iree-cuda-use-ptxas`` / ``-from`` / ``-params`` but its CUDA target never runs ptxas (3.13.0rc20261016: the
flags change no byte of the vmfb, a missing ptxas path is not even reported; the library holds none of the
code's strings), so the cubins are made here, between the two halves of :func:`~convbw_mlir.build.cuda_schedule
.compile_with_launch`: each ``hal.executable.binary`` of format ``cuda-nvptx-fb`` at the ``hal`` phase gets its PTX
images assembled by ptxas for the target's arch and put in their place (:func:`with_cubins`); the direct launch's
schedule is read from those binaries, and IREE continues from ``hal`` to the vmfb with them. The driver loads a
cubin (an ELF image) through the same ``cuModuleLoadData`` without JIT.

``CONVBW_PTXAS`` unset, empty or ``0``: PTX (the default until measured: docs/timing.md#cubin); ``1``: the ptxas on
``PATH``, else the one in PyPI's ``nvidia-cuda-nvcc`` wheel (``pip install .[cubin]``); a path: that ptxas. A cubin
runs on its arch only (``sm_90a``: Hopper; ``sm_80``: compute capability 8.x), PTX also forward.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "ELF_MAGIC",
    "PTXAS_ENV",
    "PtxasError",
    "assemble",
    "assemble_hal",
    "image_kind",
    "kernel_image",
    "ptxas",
    "requested",
    "with_cubins",
]

PTXAS_ENV = "CONVBW_PTXAS"
ELF_MAGIC = b"\x7fELF"  # a cubin is an ELF image; PTX is text
_HEADER = 64  # IREE's executable file header: magic, version, content size (iree/base/internal/flatcc/parsing.h)
_FIND = {"1", "on", "true", "yes"}  # values that ask for any ptxas found


class PtxasError(RuntimeError):
    """ptxas refused a kernel or could not run (the build reports it as a ``CompileError``)."""


def requested() -> str | None:
    """``CONVBW_PTXAS``'s value where it asks for cubins, else None (PTX)."""
    value = os.environ.get(PTXAS_ENV, "").strip()
    return None if value in ("", "0", "off", "false", "no") else value


def _wheel_ptxas() -> str | None:
    """The ptxas of the ``nvidia-cuda-nvcc`` wheel (``nvidia/cuda_nvcc/bin/ptxas``; cu13: ``nvidia/cu13/bin``)."""
    for package in ("nvidia.cuda_nvcc", "nvidia.cu13", "nvidia"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for root in spec.submodule_search_locations or () if spec else ():
            for candidate in (Path(root) / "bin" / "ptxas", Path(root) / "cuda_nvcc" / "bin" / "ptxas"):
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    return str(candidate)
    return None


def ptxas(value: str | None = None) -> str:
    """The ptxas that ``value`` (default ``CONVBW_PTXAS``) names: ``1`` finds one, else a path.

    Raises:
        ValueError: no ptxas there, naming the variable and its value and how to get one.
    """
    value = requested() if value is None else value
    if value is None:
        raise ValueError(f"{PTXAS_ENV}: unset; set it to 1 (find ptxas) or to ptxas's path for cubins")
    if value.lower() in _FIND:
        found = shutil.which("ptxas") or _wheel_ptxas()
        if found is None:
            raise ValueError(f"{PTXAS_ENV}={value!r}: no ptxas on PATH nor in the nvidia-cuda-nvcc wheel "
                             "(pip install 'convbw-mlir[cubin]', or set it to ptxas's path)")  # fmt: skip
        return found
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ValueError(f"{PTXAS_ENV}={value!r}: not an executable file (expected 1 or ptxas's path)")
    return value


@functools.cache
def version(path: str) -> str:
    """ptxas's version line (``Cuda compilation tools, release 13.0, V13.0.88``): a cubin's cache key has it."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"{PTXAS_ENV}: {path} --version failed: {e}") from None
    lines = [line for line in out.splitlines() if "release" in line]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


def image_kind(image: bytes) -> str:
    """``cubin`` (an ELF image) or ``ptx``."""
    return "cubin" if image[:4] == ELF_MAGIC else "ptx"


def kernel_image(vmfb: bytes) -> str:
    """What a CUDA vmfb's kernels are: ``cubin`` where its executables hold ELF images, else ``ptx``."""
    return "cubin" if ELF_MAGIC in vmfb else "ptx"


def assemble(ptx: bytes, arch: str, path: str) -> bytes:
    """``ptx`` assembled by ptxas ``path`` for ``arch`` (``sm_90a``).

    Raises:
        PtxasError: ptxas refused it (its first lines).
    """
    with tempfile.TemporaryDirectory(prefix="convbw-ptxas-") as d:
        src, out = Path(d) / "kernel.ptx", Path(d) / "kernel.cubin"
        src.write_bytes(ptx.rstrip(b"\0"))
        try:
            proc = subprocess.run([path, f"-arch={arch}", str(src), "-o", str(out)], capture_output=True, text=True,
                                  timeout=600)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as e:
            raise PtxasError(f"ptxas ({path}): {e}") from None
        if proc.returncode or not out.is_file():
            why = " ".join((proc.stderr or proc.stdout).strip().splitlines()[:3])
            raise PtxasError(f"ptxas -arch={arch} failed (exit {proc.returncode}): {why}")
        return out.read_bytes()


def _field(fb: bytes | bytearray, table: int, index: int) -> int:
    """Where field ``index`` of the flatbuffer table at ``table`` is (0: absent), as flatbuffers lays it out."""
    vtable = table - struct.unpack_from("<i", fb, table)[0]
    vsize = struct.unpack_from("<H", fb, vtable)[0]
    if 4 + 2 * index >= vsize:
        return 0
    rel = struct.unpack_from("<H", fb, vtable + 4 + 2 * index)[0]
    return table + rel if rel else 0


def _deref(fb: bytes | bytearray, at: int) -> int:
    return at + struct.unpack_from("<I", fb, at)[0]


def with_cubins(executable: bytes, arch: str, path: str) -> bytes:
    """An IREE CUDA executable binary (``cuda-nvptx-fb``: a 64-byte header, magic ``CDA1``, then an
    ``iree.hal.cuda.ExecutableDef`` flatbuffer: exports, modules{ptx_image}) whose PTX images are replaced by
    ptxas's cubins of them.

    Each ``ModuleDef.ptx_image`` field is pointed at a new string appended to the flatbuffer (an offset only ever
    points forward, so the appended one is valid where the old was); the old PTX stays as unreferenced bytes.
    Images that are cubins already are kept.

    Raises:
        ValueError: not a CUDA executable this reader knows. PtxasError: ptxas failed.
    """
    if len(executable) < _HEADER or executable[:4] != b"CDA1":
        raise ValueError(f"executable: not an IREE CUDA executable (starts with {executable[:4]!r})")
    version, size = struct.unpack_from("<IQ", executable, 4)
    if version != 0 or size > len(executable) - _HEADER:
        raise ValueError(f"executable: header version {version}, size {size} not readable")
    fb = bytearray(executable[_HEADER : _HEADER + size])
    root = _deref(fb, 0)
    modules = _field(fb, root, 1)
    vector = _deref(fb, modules) if modules else 0
    count = struct.unpack_from("<I", fb, vector)[0] if vector else 0
    for i in range(count):
        module = _deref(fb, vector + 4 + 4 * i)
        field = _field(fb, module, 0)
        if not field:
            continue
        start = _deref(fb, field)
        image = bytes(fb[start + 4 : start + 4 + struct.unpack_from("<I", fb, start)[0]])
        if image_kind(image) == "cubin":
            continue
        cubin = assemble(image, arch, path)
        fb += b"\0" * (-len(fb) % 8)
        at = len(fb)
        fb += struct.pack("<I", len(cubin)) + cubin + b"\0"  # a flatbuffer string: length, bytes, a zero
        struct.pack_into("<I", fb, field, at - field)
    fb += b"\0" * (-len(fb) % 16)
    header = bytearray(executable[:_HEADER])
    struct.pack_into("<Q", header, 8, len(fb))
    return bytes(header) + bytes(fb)


def assemble_hal(hal: bytes, target: Any, path: str) -> bytes:
    """A ``hal``-phase module (bytecode) whose ``cuda-nvptx-fb`` executable binaries hold cubins for
    ``target.arch`` (:func:`with_cubins`), as bytecode.

    Raises:
        PtxasError: ptxas failed.
    """
    import numpy as np

    from convbw_mlir.ir_imports import ir, new_context

    with new_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(hal, ctx)
        for op in module.body.operations:
            if op.operation.name != "hal.executable":
                continue
            for inner in op.regions[0].blocks[0].operations:
                inner = inner.operation
                if inner.name != "hal.executable.binary":
                    continue
                if ir.StringAttr(inner.attributes["format"]).value != "cuda-nvptx-fb":
                    continue
                data = bytes(memoryview(ir.DenseIntElementsAttr(inner.attributes["data"])).cast("B"))
                new = np.frombuffer(with_cubins(data, target.arch, path), dtype=np.int8)
                i8 = ir.IntegerType.get_signless(8)
                inner.attributes["data"] = ir.DenseIntElementsAttr.get(new, type=ir.VectorType.get([new.size], i8))
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()
