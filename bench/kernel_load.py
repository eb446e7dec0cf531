"""What loading a kernel costs the CUDA driver, PTX against ptxas's cubin of it (issue 39 item 2, docs/timing.md#cubin).

Every vmfb of the given candidate folders (``bench/tune_rate.py compile``, with and without ``--cubin``) holds IREE
CUDA executables (a ``CDA1`` header and flatbuffer a module); each kernel image in them is loaded with
``cuModuleLoadData`` in this process, twice: the first load JIT-compiles PTX unless the driver's ComputeCache has
it (run with a fresh ``CUDA_CACHE_PATH``: cold), the second finds it there (warm); a cubin is SASS and loads
without JIT either time. Per image: both load times, and per kernel of it the driver's ``NUM_REGS``,
``LOCAL_SIZE_BYTES`` (spills), ``SHARED_SIZE_BYTES`` and ``MAX_THREADS_PER_BLOCK``: PTX through the JIT and the
cubin through our ptxas must give the same kernel (same registers, no new spills).

    # GPU machine, no torch needed: one process, no kernel runs (nothing is timed beside it)
    CUDA_CACHE_PATH=$(mktemp -d) python3 bench/kernel_load.py ART/ptx ART/cubin --out OUT/load.json

Writes OUT (JSON: ``images``, one row an image; ``summary`` by folder) and prints the summary.

``--ptxas PATH`` (the CPU machine, no GPU): instead, each PTX image assembled by that ptxas for ``--arch``: seconds
and ``ptxas -v``'s registers per kernel: what the driver's JIT does at a cold load, timed on this CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

# cuFuncGetAttribute's CUfunction_attribute values (cuda.h)
ATTRIBUTES = {"max_threads": 0, "shared_bytes": 1, "const_bytes": 2, "local_bytes": 3, "registers": 4}


def executables(vmfb: bytes) -> list[bytes]:
    """The IREE CUDA executable binaries embedded in ``vmfb`` (header magic ``CDA1``, version 0, content size)."""
    out, at = [], vmfb.find(b"CDA1")
    while at >= 0:
        if at + 16 <= len(vmfb):
            version, size = struct.unpack_from("<IQ", vmfb, at + 4)
            if version == 0 and 64 + size <= len(vmfb) - at and vmfb[at + 68 : at + 72] == b"CDA1":
                out.append(vmfb[at : at + 64 + size])
                at = vmfb.find(b"CDA1", at + 64 + size)
                continue
        at = vmfb.find(b"CDA1", at + 4)
    return out


def images(folder: Path) -> list[dict[str, Any]]:
    """Each kernel image of ``folder``'s vmfbs: its vmfb, index, kind, bytes and kernel names."""
    from convbw_mlir.build.cuda_schedule import read_cuda_executable
    from convbw_mlir.cuda_launch import image_kind

    rows = []
    for vmfb in sorted(folder.glob("*.vmfb")):
        for e, data in enumerate(executables(vmfb.read_bytes())):
            exports, imgs = read_cuda_executable(data)
            for m, image in enumerate(imgs):
                names = [x.name for x in exports if x.module == m]
                rows.append({"vmfb": vmfb.name, "executable": e, "module": m, "kind": image_kind(image),
                             "bytes": len(image), "kernels": names, "image": image})  # fmt: skip
    return rows


class Driver:
    """libcuda, the device's primary context current on this thread."""

    def __init__(self, device: int = 0) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._check(self.lib.cuInit(0), "cuInit")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        name = ctypes.create_string_buffer(256)
        self.lib.cuDeviceGetName(name, 256, dev)
        self.name = name.value.decode()

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what}: CUDA error {rc}")

    def load(self, image: bytes) -> tuple[int, float]:
        """(module, seconds of cuModuleLoadData)."""
        mod = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image + b"\0"))
        seconds = time.perf_counter() - t0
        self._check(rc, "cuModuleLoadData")
        return mod.value, seconds

    def attributes(self, module: int, kernel: str) -> dict[str, int]:
        f, value = ctypes.c_void_p(), ctypes.c_int()
        self._check(self.lib.cuModuleGetFunction(ctypes.byref(f), ctypes.c_void_p(module), kernel.encode()),
                    f"cuModuleGetFunction({kernel})")  # fmt: skip
        out = {}
        for name, attribute in ATTRIBUTES.items():
            self._check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, f), "cuFuncGetAttribute")
            out[name] = value.value
        return out

    def unload(self, module: int) -> None:
        self.lib.cuModuleUnload(ctypes.c_void_p(module))


def measure(folders: list[Path]) -> dict[str, Any]:
    drv = Driver()
    rows = []
    for folder in folders:
        for row in images(folder):
            image = row.pop("image")
            try:
                mod, cold = drv.load(image)
                attrs = {k: drv.attributes(mod, k) for k in row["kernels"]}
                drv.unload(mod)
                mod, warm = drv.load(image)
                drv.unload(mod)
                row |= {"cold_s": cold, "warm_s": warm, "attributes": attrs}
            except RuntimeError as e:
                row["error"] = str(e)
            rows.append(row | {"folder": folder.name})
    summary = {}
    for folder in folders:
        mine = [r for r in rows if r["folder"] == folder.name and "cold_s" in r]
        failed = [r for r in rows if r["folder"] == folder.name and "error" in r]
        if failed and not mine:  # every image refused: say so, with the first error
            summary[folder.name] = {"images": 0, "kinds": [], "failed": len(failed), "first_error": failed[0]["error"]}
        if mine:
            summary[folder.name] = {
                "images": len(mine), "kinds": sorted({r["kind"] for r in mine}),
                "failed": sum(r["folder"] == folder.name and "error" in r for r in rows),
                "cold_s_sum": sum(r["cold_s"] for r in mine), "warm_s_sum": sum(r["warm_s"] for r in mine),
                "cold_s_median": statistics.median(r["cold_s"] for r in mine),
                "warm_s_median": statistics.median(r["warm_s"] for r in mine),
            }  # fmt: skip
    same = _same_kernels(rows, folders)
    cache = os.environ.get("CUDA_CACHE_PATH", "(default)")
    return {"device": drv.name, "cuda_cache_path": cache, "cache_disabled": os.environ.get("CUDA_CACHE_DISABLE"),
            "summary": summary, "same_kernels": same, "images": rows}  # fmt: skip


def _same_kernels(rows: list[dict[str, Any]], folders: list[Path]) -> dict[str, Any]:
    """The first folder's kernels against each other folder's of the same vmfb name and kernel: attributes equal?"""
    if len(folders) < 2:
        return {}
    by = {}
    for r in rows:
        for k, a in r.get("attributes", {}).items():
            by[(r["folder"], r["vmfb"], k)] = a
    out = {}
    base = folders[0].name
    for other in folders[1:]:
        pairs = [(a, by[(other.name, v, k)]) for (f, v, k), a in by.items() if f == base and (other.name, v, k) in by]
        differ = [(a, b) for a, b in pairs if a != b]
        out[other.name] = {"kernels": len(pairs), "differ": len(differ), "examples": differ[:5],
                           "registers_more": sum(b["registers"] > a["registers"] for a, b in pairs),
                           "registers_fewer": sum(b["registers"] < a["registers"] for a, b in pairs),
                           "spills_more": sum(b["local_bytes"] > a["local_bytes"] for a, b in pairs)}  # fmt: skip
    return out


def assemble_times(folders: list[Path], ptxas: str, arch: str) -> dict[str, Any]:
    """Each PTX image of ``folders`` assembled by ``ptxas``: seconds and registers (``ptxas -v``), one process each."""
    import subprocess
    import tempfile

    rows = []
    for folder in folders:
        for row in images(folder):
            image = row.pop("image")
            if row["kind"] != "ptx":
                continue
            with tempfile.TemporaryDirectory() as d:
                src = Path(d) / "kernel.ptx"
                src.write_bytes(image.rstrip(b"\0"))
                t0 = time.perf_counter()
                p = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(d) / "k.cubin")],
                                   capture_output=True, text=True)  # fmt: skip
                seconds = time.perf_counter() - t0
            regs = [
                int(line.split("Used ")[1].split(" registers")[0]) for line in p.stderr.splitlines() if "Used " in line
            ]
            rows.append(row | {"folder": folder.name, "ptxas_s": seconds, "registers": regs, "rc": p.returncode})
    per: dict[str, float] = {}
    for r in rows:
        per[r["vmfb"].split(".")[0]] = per.get(r["vmfb"].split(".")[0], 0.0) + r["ptxas_s"]
    summary = {"images": len(rows), "ptxas_s_sum": sum(r["ptxas_s"] for r in rows), "per_problem_s": per,
               "ptxas_s_median": statistics.median(r["ptxas_s"] for r in rows) if rows else None,
               "cpus": os.cpu_count(), "load_average": os.getloadavg()}  # fmt: skip
    return {"ptxas": ptxas, "arch": arch, "summary": summary, "images": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="candidate folders (PTX first: the others are compared with it)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ptxas", default=None, help="time this ptxas on the PTX images instead (CPU; no GPU needed)")
    ap.add_argument("--arch", default="sm_90a", help="with --ptxas: the arch to assemble for")
    args = ap.parse_args(argv)
    folders = [Path(f) for f in args.folders]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.ptxas:
        result = assemble_times(folders, args.ptxas, args.arch)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        s = result["summary"]
        print(f"{s['images']} PTX images through {args.ptxas} -arch={args.arch} on {s['cpus']} CPUs (load "
              f"{s['load_average'][0]:.1f}): {s['ptxas_s_sum']:.2f} s in all, median {s['ptxas_s_median']:.3f} s; "
              f"per problem " + ", ".join(f"{k} {v:.2f}" for k, v in s["per_problem_s"].items()))  # fmt: skip
        return 0
    result = measure(folders)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['device']}, CUDA_CACHE_PATH {result['cuda_cache_path']}")
    for name, s in result["summary"].items():
        if not s["images"]:
            print(f"- {name}: every image failed to load ({s['failed']}): {s['first_error']}")
            continue
        print(f"- {name}: {s['images']} images ({', '.join(s['kinds'])}), failed {s['failed']}: load cold "
              f"{s['cold_s_sum']:.2f} s in all (median {1e3 * s['cold_s_median']:.1f} ms), "
              f"warm {s['warm_s_sum']:.2f} s (median {1e3 * s['warm_s_median']:.1f} ms)")  # fmt: skip
    for name, s in result["same_kernels"].items():
        print(
            f"- {name} vs {folders[0].name}: {s['kernels']} kernels, attributes differ on {s['differ']} "
            f"(registers more {s['registers_more']}, fewer {s['registers_fewer']}; spills more {s['spills_more']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
