"""A static estimate of our AMD kernel against IREE's own kernel for the same problem, on MI300X (gfx942)
and RX 7900 XTX (gfx1100). An ESTIMATE: no AMD GPU exists here; nothing below was timed.

    .venv/bin/python bench/amd_estimate.py [--targets gfx942,gfx1100] [--only NAME,...] [--out PATH.md]

Per problem (bench/isa_explicit.py's dense suite, layout 4) and target, two kernels:

* ours: the explicit kernel (``strategy="explicit"``). Its work comes from the AMD emulator
  (tests/amd_emulator.py, :class:`Counts`): one workgroup emulated at batch 1 and at batch 2 (no split)
  gives the matrix instructions, global bytes, LDS bytes and LDS clocks with bank conflicts of one k tile
  and of the rest, scaled to the plan's grid and k tiles. Registers, LDS and occupancy from the ISA report.
* IREE's: IREE 3.13's default pipeline on the plain linalg form (``iree_direct`` of
  convbw_mlir/bench/artifacts.py). Its work comes from its own ``lowering_config`` (workgroup tile,
  padding, subgroup tile, intrinsic) over the problem's loops, its grid from the launch schedule
  (convbw_mlir/build/hip_schedule.py), registers/LDS/occupancy from the ISA report. No emulation: its LDS is
  taken as conflict-free (IREE pads promoted operands against bank conflicts); a lower bound of its LDS time.

The bound of a dispatch: ``max(matrix, LDS, DRAM, cache)`` with matrix = instructions x 2mnk / peak,
LDS = LDS clocks / (CUs x clock), DRAM = the buffers it binds, each once / memory bandwidth, cache = the
bytes its workgroups request (every tile re-read, as emulated or as the config tiles it) / the last-level
cache's bandwidth; the matrix and LDS times are divided by the CU fill of the last wave of workgroups
(``(W / CUs) / ceil(W / CUs)``). Other dispatches (pads, split-K sums, casts) move their buffers once.
A kernel's estimate is the sum of its dispatches. Latency, caches,
clocks under load and instruction issue are not modelled: the ratio between the two kernels is the
result, not the microseconds.

Peaks (AMD's published specifications; the target table, convbw_mlir/targets.py):

* MI300X: 304 CUs, 2100 MHz peak engine clock, 1307.4 TFLOP/s dense FP16/BF16 matrix, 5.3 TB/s HBM3 —
  "AMD Instinct MI300X Accelerator" data sheet,
  https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf
* RX 7900 XTX: 96 CUs, 2500 MHz boost clock, 122.8 TFLOP/s peak FP16, 960 GB/s GDDR6 — AMD product page,
  https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html
* Last-level cache: MI300X 256 MB Infinity Cache, 17.2 TB/s peak ("AMD CDNA 3 Architecture" white paper);
  RX 7900 XTX 96 MB Infinity Cache, 3.5 TB/s "effective memory bandwidth" (the product page above).
* LDS: 128 bytes a clock a CU (CDNA 3 white paper, "AMD CDNA 3 Architecture", LDS section; RDNA 3: 64
  banks a WGP of two CUs, taken as the same per CU).
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the emulator lives with the tests (it is test code, not product)
sys.path.insert(0, str(ROOT / "bench"))

# per target: (name, CUs, clock GHz, LDS bytes a clock a CU, LDS banks, cache TB/s); peaks and DRAM: the
# target table (convbw_mlir/targets.py)
DEVICES = {"gfx942": ("MI300X", 304, 2.1, 128, 32, 17.2), "gfx1100": ("RX 7900 XTX", 96, 2.5, 128, 64, 3.5)}
SUBSPAN = re.compile(r"binding\.subspan.*: memref<([\dx]+)x(f16|bf16|f32)\b")
INTRINSIC = re.compile(r"(\d+)x(\d+)x(\d+)")


@dataclass
class Dispatch:
    """One dispatch's estimate: its work and the time each resource needs for it (seconds)."""

    name: str
    workgroups: int = 0
    mma: int = 0
    flops: float = 0.0  # matrix flops issued (padding included)
    global_bytes: float = 0.0  # requested by the workgroups
    dram_bytes: float = 0.0  # the buffers it binds, once
    lds_bytes: float = 0.0
    lds_cycles: float = 0.0
    conflict: float = 1.0  # LDS clocks / clocks without conflicts
    t: dict = field(default_factory=dict)

    @property
    def time(self) -> float:
        return max(self.t.values()) if self.t else 0.0

    @property
    def bound(self) -> str:
        return max(self.t, key=self.t.get) if self.t else "-"


@dataclass
class Estimate:
    kernel: str
    dispatches: list[Dispatch]
    useful_flops: float
    vgpr: str = ""
    lds: int = 0
    occupancy: str = ""
    note: str = ""

    @property
    def time(self) -> float:
        return sum(d.time for d in self.dispatches)

    @property
    def main(self) -> Dispatch:
        return max(self.dispatches, key=lambda d: d.time)


def _times(d: Dispatch, target: str, dtype: str) -> None:
    from convbw_mlir.targets import get_target

    tgt = get_target(target)
    _, cus, ghz, _, _, cache = DEVICES[target]
    fill = (d.workgroups / cus) / math.ceil(d.workgroups / cus) if d.workgroups else 1.0
    d.t = {"DRAM": d.dram_bytes / (tgt.bandwidth_gbs * 1e9), "cache": d.global_bytes / (cache * 1e12)}
    if d.flops:
        d.t["matrix"] = d.flops / (tgt.peak_tflops[dtype] * 1e12) / fill
    if d.lds_cycles:
        d.t["LDS"] = d.lds_cycles / (cus * ghz * 1e9) / fill


def _compile(text: str | bytes, target: str, flags: list[str]) -> tuple[dict, object]:
    """(IREE's dumped intermediates, the launch) of one compile."""
    from convbw_mlir.build.hip_schedule import compile_with_hip_launch

    with tempfile.TemporaryDirectory(prefix="convbw-est-") as d:
        dump = [f"--iree-hal-dump-executable-intermediates-to={d}", f"--iree-hal-dump-executable-configurations-to={d}"]
        _, launch = compile_with_hip_launch(text, target, [*flags, *dump])
        files = {p.name: p.read_text(errors="replace") for p in sorted(Path(d).iterdir())
                 if p.suffix in (".rocmasm",) or p.name.startswith("configured_")}  # fmt: skip
    return files, launch


def _dispatches(files: dict) -> dict[str, tuple[float, str]]:
    """Kernel name -> (bytes of the buffers it binds, its configured IR), from IREE's configured executables."""
    out = {}
    for name, body in files.items():
        func = re.search(r"func\.func @(\w+)", body) if name.startswith("configured_") else None
        if func:
            sizes = [math.prod(int(v) for v in dims.split("x")) * (4 if t == "f32" else 2)
                     for dims, t in SUBSPAN.findall(body)]  # fmt: skip
            out[func.group(1)] = (float(sum(sizes)), body)
    return out


def _isa(files: dict, target: str, kernel: str) -> tuple[str, int, str]:
    from convbw_mlir.build.isa import report

    k = {r.name: r for r in report(files, target).kernels}.get(kernel)
    if k is None:
        return "?", 0, "?"
    regs = f"{k.vgpr}+{k.agpr}" if k.agpr else f"{k.vgpr}"
    return regs, k.lds_bytes, f"{k.occupancy} ({k.occupancy_limit})"


def ours(problem, target: str) -> Estimate:
    """Our explicit kernel: the emulator's counts of one workgroup, scaled to the plan's grid."""
    from amd_emulator import Counts, emulate

    from convbw_mlir import compile_op
    from convbw_mlir.kernels import gemm_cdna
    from convbw_mlir.plan import decide, explicit_tiling
    from convbw_mlir.policies.sm80 import gemm_shape

    plan = decide(problem, target, strategy="explicit")
    t = explicit_tiling(plan)
    shape = gemm_shape(problem, plan.k_batch)
    per = {}
    for b in (1, 2):
        small = problem.with_(batch=b)
        sp = decide(small, target, strategy="explicit", k_batch=1)
        if explicit_tiling(sp) != t:
            raise ValueError(f"the batch-{b} plan tiles {explicit_tiling(sp)}, the problem's {t}")
        c = Counts(banks=DEVICES[target][4])
        emulate(small, target, plan=sp, blocks=[(0, 0, 0)], counts=c)
        per[b] = (c, -(-gemm_shape(small).reduction // t.bk))
    (c1, k1), (c2, k2) = per[1], per[2]
    fields = ("mma", "global_load_bytes", "global_store_bytes", "lds_read_bytes", "lds_write_bytes", "lds_cycles",
              "lds_ideal_cycles")  # fmt: skip
    tile = {f: (getattr(c2, f) - getattr(c1, f)) / (k2 - k1) for f in fields}
    fixed = {f: getattr(c1, f) - k1 * tile[f] for f in fields}
    ktiles = -(-shape.reduction // t.bk)
    per_split = -(-ktiles // shape.splits)
    grid = gemm_cdna.grid(shape, t)
    wgs = grid[0] * grid[1] * grid[2]
    total = {f: wgs * (fixed[f] + per_split * tile[f]) for f in fields}
    m, n, k = (int(v) for v in INTRINSIC.search(plan.tile.intrinsic).groups())
    op = compile_op(problem, target, plan=plan, output_arg=True)
    files, _ = _compile(op.stages["linalg"], target, [])
    kernels = _dispatches(files)
    main = Dispatch("gemm", wgs, int(total["mma"]), total["mma"] * 2 * m * n * k,
                    total["global_load_bytes"] + total["global_store_bytes"], kernels["gemm"][0],
                    total["lds_read_bytes"] + total["lds_write_bytes"], total["lds_cycles"],
                    total["lds_cycles"] / max(total["lds_ideal_cycles"], 1))  # fmt: skip
    dispatches = [main] + [Dispatch(k, global_bytes=b, dram_bytes=b) for k, (b, _) in kernels.items() if k != "gemm"]
    for d in dispatches:
        _times(d, target, problem.dtype)
    regs, lds, occ = _isa(files, target, "gemm")
    note = (f"tile {t.bm}x{t.bn}x{t.bk}, split {shape.splits}, {per_split} k tiles a workgroup, "
            f"{len(dispatches)} dispatches")  # fmt: skip
    return Estimate("ours", dispatches, float(shape.flops), regs, lds, occ, note)


def _lowering(text: str) -> tuple[dict, dict] | None:
    """(lowering_config lists, the contraction's loops and extents) of the dispatch with a matrix config."""
    m = re.search(r"lowering_config = #iree_gpu\.lowering_config<\{(.*?)\}>", text)
    c = re.search(r"extents = array<i64: ([\d, ]+)>.*?loops = \[([^\]]*)\]", text)
    if not m or not c:
        return None
    cfg = {k: [int(v) for v in vals.split(",")] for k, vals in re.findall(r"(\w+) = \[([\d, ]+)\]", m.group(1))}
    kind = re.search(r"mma_kind = #iree_gpu\.mma_layout<(\w+)>", m.group(1))
    cfg["intrinsic"] = kind.group(1) if kind else ""
    loops = [s.strip().strip('"') for s in c.group(2).split(",")]
    return cfg, dict(zip(loops, (int(v) for v in c.group(1).split(","))))


def iree(problem, target: str) -> Estimate:
    """IREE's default kernel for the problem: its lowering config over the problem's loops."""
    from convbw_mlir.build.contenders import build_contender

    text, flags = build_contender(problem, "iree_direct", target)
    files, launch = _compile(text, target, flags)
    kernels = _dispatches(files)
    main_name, cfg, loops = None, None, None
    for name, (_, body) in kernels.items():
        found = _lowering(body)
        if found and found[0]["intrinsic"]:
            main_name, (cfg, loops) = name, found
    if cfg is None:
        raise ValueError("IREE's kernel has no matrix lowering_config (not an MFMA/WMMA kernel)")
    m, n, k = (int(v) for v in INTRINSIC.search(cfg["intrinsic"]).groups())
    names, extents = list(loops), list(loops.values())
    red = [i for i, nm in enumerate(names) if nm in ("n", "b") or nm.startswith("o")]  # batch and output positions
    par = [i for i in range(len(names)) if i not in red]
    wg = cfg["workgroup"]
    if len(wg) < len(par):
        raise ValueError(f"IREE's workgroup tile {wg} does not cover the loops {names}")
    tile = {names[i]: (wg[j] or extents[i]) for j, i in enumerate(par)}
    a_side = [nm for nm in tile if nm not in ("k", "g")]  # x's loops (c and the filter taps); dy's: k
    tile_a = math.prod(tile[nm] for nm in a_side)
    tile_b = tile.get("k", 1)
    # the IGEMM reduction: one config entry a reduction loop, the trailing loops merged into the last entry
    pads = cfg.get("padding", [0] * len(wg))[len(par) :] or [1]
    red_ext = [extents[i] for i in red]
    merged = red_ext[: len(pads) - 1] + [math.prod(red_ext[len(pads) - 1 :])]
    k_pad = math.prod(-(-e // max(p, 1)) * max(p, 1) for e, p in zip(merged, pads))
    wgs_model = math.prod(-(-extents[i] // tile[names[i]]) for i in par)
    # the launch's grid where the direct launch reads IREE's schedule (it refuses two transients)
    step = [s for s in launch.dispatches if s.kernel == main_name] if launch.refused is None else []
    wgs = step[0].grid[0] * step[0].grid[1] * step[0].grid[2] if step else wgs_model
    sub = cfg.get("subgroup", [1] * len(par))
    sub_a = math.prod(sub[j] for j, i in enumerate(par) if names[i] in a_side) * m
    sub_b = math.prod(sub[j] for j, i in enumerate(par) if names[i] == "k") * n
    mac = wgs * tile_a * tile_b * k_pad
    out_bytes = math.prod(problem.dw_shape) * (4 if problem.dw_dtype == "f32" else 2)
    loads = wgs * (tile_a + tile_b) * k_pad * 2
    lds_reads = wgs * k_pad * 2 * (tile_a * (tile_b // sub_b) + tile_b * (tile_a // sub_a))
    if cfg["intrinsic"].startswith("WMMAR3"):  # RDNA 3 takes A and B in both half-waves: each read twice
        lds_reads *= 2
    lds = loads + lds_reads
    main = Dispatch(main_name, wgs, mac // (m * n * k), 2.0 * mac, loads + out_bytes, kernels[main_name][0], lds,
                    lds / DEVICES[target][3], 1.0)  # fmt: skip
    dispatches = [main] + [Dispatch(k, global_bytes=b, dram_bytes=b) for k, (b, _) in kernels.items() if k != main_name]
    for d in dispatches:
        _times(d, target, problem.dtype)
    regs, lds_b, occ = _isa(files, target, main_name)
    note = (f"tile {tile_b}x{tile_a} (k x c·taps), reduction {k_pad} padded of {math.prod(red_ext)}, "
            f"{cfg['intrinsic']}; grid {wgs}{'' if step else ' (config)'}, {len(dispatches)} dispatches")  # fmt: skip
    useful = 2.0 * problem.groups * problem.out_channels * problem.in_channels * math.prod(problem.filter_size)
    useful *= math.prod(red_ext)
    return Estimate("IREE", dispatches, useful, regs, lds_b, occ, note)


def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


def table(rows: list[tuple], targets: list[str]) -> str:
    lines = []
    for target in targets:
        name = DEVICES[target][0]
        lines += [f"### {target} ({name})", "",
                  "| problem | ours µs (bound) | IREE µs (bound) | IREE / ours | ours: MFMA/WMMA, LDS conflict x, "
                  "VGPR, occupancy | IREE: MMA, padded work x, VGPR, occupancy |",
                  "|---|---:|---:|---:|---|---|"]  # fmt: skip
        for pname, tgt, o, i, err in rows:
            if tgt != target:
                continue
            if err:
                lines.append(f"| {pname} | {err} | | | | |")
                continue
            ratio = f"{i.time / o.time:.2f}" if o and i else "-"
            oc = f"{o.main.mma:,}, {o.main.conflict:.2f}, {o.vgpr}, {o.occupancy}; {o.note}" if o else "-"
            ic = (f"{i.main.mma:,}, {i.main.flops / i.useful_flops:.2f}, {i.vgpr}, {i.occupancy}; {i.note}"
                  if i else "-")  # fmt: skip
            ot = f"{_us(o.time)} ({o.main.bound})" if o else "refused"
            it = f"{_us(i.time)} ({i.main.bound})" if i else "failed"
            lines.append(f"| {pname} | {ot} | {it} | {ratio} | {oc} | {ic} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="gfx942,gfx1100")
    ap.add_argument("--only", default="", help="comma-separated problem names (default: all 2-D dense problems)")
    ap.add_argument("--out", default="", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    if args.out and Path(args.out).is_dir():
        print(f"--out: {args.out} is a folder, not a file", file=sys.stderr)
        return 1
    from isa_explicit import dense_problems

    from convbw_mlir.plan import PlanError

    targets = args.targets.split(",")
    bad = [t for t in targets if t not in DEVICES]
    if bad:
        print(f"--targets: {bad[0]} is not one of {', '.join(DEVICES)}", file=sys.stderr)
        return 1
    problems = {k: v for k, v in dense_problems().items() if len(v.filter_size) == 2}
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in problems]
        if unknown:
            print(f"--only: {unknown[0]} is not a 2-D dense suite problem", file=sys.stderr)
            return 1
        problems = {k: problems[k] for k in args.only.split(",")}
    rows = []
    for pname, p in problems.items():
        for target in targets:
            o = i = None
            try:
                o = ours(p, target)
            except PlanError as e:
                rows.append((pname, target, None, None, f"refused: {str(e)[:80]}"))
                continue
            try:
                i = iree(p, target)
            except Exception as e:  # noqa: BLE001 - IREE failing on a problem is a row of the table
                print(f"{pname} {target}: IREE: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            rows.append((pname, target, o, i, ""))
            print(f"{target} {pname}: ours {_us(o.time)} us ({o.main.bound}), "
                  f"IREE {_us(i.time) if i else '-'} us ({i.main.bound if i else '-'})", flush=True)  # fmt: skip
    text = table(rows, targets)
    print(text)
    if args.out:
        head = (f"# AMD static estimate, {datetime.date.today()} (bench/amd_estimate.py; an ESTIMATE, no AMD GPU)\n\n"
                f"Command: `.venv/bin/python bench/amd_estimate.py {' '.join(argv or sys.argv[1:])}`\n\n")  # fmt: skip
        from convbw_mlir.files import write_atomic

        write_atomic(args.out, head + text + "\n")  # nothing half-written is left behind
    return 0


if __name__ == "__main__":
    sys.exit(main())
