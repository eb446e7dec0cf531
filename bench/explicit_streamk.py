"""StreamK against the explicit kernel's split-K on the StreamK suite problems (issue 14, step 4), in the
shape of CK's StreamK PR table: problem, tiles, best split-K, StreamK, speedup.

Compile here (needs the IREE compiler), run there (needs iree-base-runtime, numpy, torch):

    .venv/bin/python bench/explicit_streamk.py compile DIR            # all contenders, isolated compiles
    python3 explicit_streamk.py run DIR --out OUT --budget 60          # on the GPU machine

Contenders per ``streamk_*`` problem of ``seeds`` (layout 4, the explicit kernel's default 128x256x64
tiling): StreamK on 132 workgroups (the H100's SMs) with the linear and with the tree fixup; split-K
with k_batch from the kernel's own rule (``auto_splits`` sized on 132 SMs) and one other (the rule on
sm_80's 108 SMs where it differs, else twice the rule, or 2 where the rule says 1). CK's problem
(``streamk_1x1_k256_c64_n32_56``) also with CK's 128x128 tiles. cuDNN's times, for scale, in one child.

``run`` starts one child per contender (a CUDA fault poisons a process; cuDNN's share one). All children
start at once and do their set-up and correctness check in parallel (torch, IREE's device, CUPTI's
first session, the reference: cuDNN in f32 without TF32); then, once all are ready, the parent lets
them time one at a time, alone on the GPU, in priority order, until ``--budget`` seconds are spent.
Kernel time by CUPTI (torch.profiler): ``single`` = median per call of calls 10 ms apart, ``sustained``
= per call over back-to-back calls. StreamK's call also copies its 4-byte-a-workgroup flags (zeroed) before the
kernel: that copy is CUPTI's ``gpu_memcpy``, reported apart (``copy_us``), not in the kernel time.
Writes ``OUT/explicit_streamk.json`` and ``.md`` (and ``rows.json`` as it goes).
"""

from __future__ import annotations

import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script (its docstring says how)

from convbw_mlir.measure.cupti import gpu_activities

SEED = 5
SMS = 132  # the H100 the run uses (the sm_80 target table's 108 is an A100's)
SINGLE_REPS = 10
SUSTAINED_CALLS = 100
CK_PROBLEM = "streamk_1x1_k256_c64_n32_56"
TURN_LIMIT = 8.0  # seconds one child may take to time its contender(s), cuDNN's eight included
# A CPU rehearsal of the run side (``compile --smoke``, STREAMK_BENCH_DEVICE=cpu): host kernels, no timing.
DEVICE = os.environ.get("STREAMK_BENCH_DEVICE", "cuda")


# -- compile side ------------------------------------------------------------------------------------
def _problems() -> dict[str, Any]:
    from convbw_mlir.suites import load_suite

    suites = Path(__file__).resolve().parents[1] / "convbw_mlir" / "suites"
    return {name: p.with_(layout=4) for name, p in load_suite(suites / "seeds.tsv") if name.startswith("streamk_")}


def _contenders(name: str, p) -> list[tuple[str, dict[str, Any]]]:
    """(contender, compile options) for one problem, in priority order."""
    from convbw_mlir.plan import decide, explicit_tiling
    from convbw_mlir.policies.sm80 import GemmTiling, auto_splits, gemm_shape

    shape = gemm_shape(p)
    own = explicit_tiling(decide(p, "sm_80", strategy="explicit"))  # the tiling rule's: split-K and StreamK alike
    out = [("streamk_linear", {"streamk": SMS}), ("streamk_tree", {"streamk": SMS, "streamk_fixup": "tree"})]
    ck = (GemmTiling(bn=128, wn=32), "_128x128", {"tile_m": 128, "tile_n": 128})  # CK's tile for its problem
    for tiling, suffix, opts in ((own, "", {}), ck):
        if suffix and name != CK_PROBLEM:
            continue
        rule = auto_splits(shape, tiling, SMS)
        other = auto_splits(shape, tiling, 108)
        ktiles = -(-shape.reduction // tiling.bk)
        if other == rule:
            other = min(2 * rule, ktiles)
        if suffix:
            out = [*out, (f"streamk_tree{suffix}", {"streamk": SMS, "streamk_fixup": "tree", **opts})]
            out.append((f"streamk_linear{suffix}", {"streamk": SMS, **opts}))
        out.append((f"splitk{rule}_rule{suffix}", {"k_batch": rule, **opts}))
        if other != rule and not suffix:
            out.append((f"splitk{other}{suffix}", {"k_batch": other, **opts}))
    return out


def _entry(name: str, contender: str, p, plan: Any) -> dict[str, Any]:
    return {
        "name": f"{contender}:{name}",
        "problem": name,
        "contender": contender,
        "kind": "cudnn" if contender == "cudnn" else "ours",
        "vmfb": f"{contender}_{name}.vmfb",
        **harness.problem_fields(p),
        "plan": plan.to_dict() if plan is not None else None,
    }


def compile_all(folder: Path, smoke: bool = False) -> None:
    """Compile every contender into ``folder`` (vmfbs and manifest.json); ``smoke``: two small problems'
    host kernels under the same names, for a CPU rehearsal of the run side."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.kernels.streamk_sm80 import StreamK
    from convbw_mlir.plan import PlanError, decide
    from convbw_mlir.policies.sm80 import GemmTiling, gemm_shape
    from convbw_mlir.problem import ConvBwdWeightProblem as P

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused, tiles = [], {}, {}
    problems = _problems()
    if smoke:
        problems = {"small_3x3": P.from_ck("2 1 2 8 4 3 3 6 6 1 1 1 1 1 1 1 1", layout=4),
                    "small_1x1": P.from_ck("2 1 2 16 8 1 1 4 4 1 1 1 1 0 0 0 0", layout=4)}  # fmt: skip
    order = {CK_PROBLEM: 0}
    for name, p in sorted(problems.items(), key=lambda kv: order.get(kv[0], 1)):
        shape = gemm_shape(p)
        sk = StreamK.of(shape, GemmTiling(), SMS)
        tiles[name] = {"tiles": sk.tiles, "k_tiles": sk.iters, "partial_tiles": sk.partial_tiles()}
        for contender, opts in _contenders(name, p) if not smoke else [("streamk_linear", {}), ("splitk2_rule", {})]:
            key = f"{contender}:{name}"
            t0 = time.time()
            try:
                if smoke:
                    op = compile_op(p, "host", isolate=True, cache=False)
                else:
                    decide(p, "sm_80", strategy="explicit", **opts)  # a refusal names its field
                    op = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False, **opts)
            except (PlanError, CompileError) as e:
                refused[key] = str(e)[:500]
                print(f"{key}: refused: {str(e)[:200]}", flush=True)
                continue
            (folder / f"{contender}_{name}.vmfb").write_bytes(op.vmfb)
            entries.append(_entry(name, contender, p, op.plan))
            print(f"{key}: {time.time() - t0:.1f} s", flush=True)
        entries.append(_entry(name, "cudnn", p, None))
    harness.write_manifest(folder, {"target": "host" if smoke else "sm_80", "sms": SMS, "entries": entries,
                                    "refused": refused, "tiles": tiles, "seed": SEED})  # fmt: skip


# -- run side ----------------------------------------------------------------------------------------
def _prepare(folder: Path, e: dict, torch: Any) -> tuple[Any, dict]:
    """The contender's call on device-resident inputs, and its correctness against cuDNN in f32 (no TF32)."""
    dy, x = harness.nchw_inputs(e, SEED, DEVICE, torch)
    torch.backends.cudnn.allow_tf32 = False
    exact = harness.conv2d_weight(e, x.float(), dy.float(), torch).double().cpu()
    exact = exact.reshape(e["groups"], e["out_channels"], -1)
    if e["kind"] == "cudnn":
        torch.backends.cudnn.benchmark = True
        xc, dyc = (x, dy) if DEVICE == "cuda" else (x.float(), dy.float())

        def call() -> Any:
            return harness.conv2d_weight(e, xc, dyc, torch)

        def result(r: Any) -> Any:
            return r.double().cpu().reshape(e["groups"], e["out_channels"], -1)
    else:
        n, g = e["images"], e["groups"]
        xs, dys = (n, g, e["in_channels"], *e["input_size"]), (n, g, e["out_channels"], *e["output_size"])
        call = harness.iree_call(folder / e["vmfb"], "conv_bwd_weight", DEVICE, x.cpu().numpy().reshape(xs),
                                 dy.cpu().numpy().reshape(dys))  # fmt: skip

        def result(r: Any) -> Any:
            return torch.from_numpy(r.to_host().astype("float64")).reshape(e["groups"], e["out_channels"], -1)

    with harness.device_lock().timing():  # cuDNN's first call searches its algorithms by timing them
        got = result(call())
    harness.KEEP.append(got)
    return call, harness.check(got, exact, e["dw_dtype"], torch)


def _time(call: Any, e: dict, torch: Any) -> dict[str, Any]:
    """Kernel time by CUPTI: single calls 10 ms apart, then back-to-back calls."""
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)

    def done(r: Any) -> None:
        r.to_host() if e["kind"] != "cudnn" else sync()

    kinds = harness.activities(torch, DEVICE, cpu=False)
    events, wall = harness.profile_calls(call, done, torch, kinds, SINGLE_REPS, SUSTAINED_CALLS, gpu_activities,
                                         settle=0.02)  # fmt: skip
    calls = harness.calls(events, 5000.0)  # the single calls are 10 ms apart
    rec: dict[str, Any] = {"sustained_wall_us": wall * 1e6}
    single, sustained = calls[:SINGLE_REPS], calls[SINGLE_REPS:]
    kernels = [[ev for ev in c if ev[2] == "kernel"] for c in single]
    rec["kernels_per_call"] = statistics.mean(len(k) for k in kernels) if kernels else None
    rec["kernel_names"] = sorted({ev[3] for c in kernels for ev in c})[:4]
    rec["single_us"] = statistics.median(sum(ev[1] for ev in k) for k in kernels) if kernels else None
    copies = [sum(ev[1] for ev in c if ev[2] != "kernel" and "DtoH" not in ev[3]) for c in single]  # not the readback
    rec["copy_us"] = statistics.median(copies) if copies else None
    flat = [ev for c in sustained for ev in c if ev[2] == "kernel"]
    rec["sustained_us"] = sum(ev[1] for ev in flat) / SUSTAINED_CALLS if flat else None
    for key in ("single", "sustained"):
        rec[f"{key}_tflops"] = harness.tflops(e["flops"], rec[f"{key}_us"])
    return rec


def child(folder: Path, names: list[str]) -> None:
    """One contender (or cuDNN's, several): set up and check now, time when the parent says ``go``."""
    import torch

    manifest = harness.load_manifest(folder)
    entries = [e for e in manifest["entries"] if e["name"] in names]
    prepared = []
    with harness.device_lock().shared():  # set-up is GPU work: never beside another child's timing
        with torch.profiler.profile(
            activities=harness.activities(torch, DEVICE, cpu=False)
        ):  # the first session costs seconds: not in the turn
            torch.zeros(1, device=DEVICE).add_(1)
        for e in entries:
            try:
                call, rec = _prepare(folder, e, torch)
            except Exception as exc:  # one contender's failure is its row, not the run's
                print(json.dumps({"name": e["name"], "error": repr(exc)[:500]}), flush=True)
                continue
            prepared.append((e, call, rec))
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    print(json.dumps({"ready": names, "device": device}), flush=True)
    if sys.stdin.readline().strip() != "go":
        harness.exit_child()
    for e, call, rec in prepared:
        rec.update(name=e["name"], kind=e["kind"], flops=e["flops"])
        if rec["correct"] or e["kind"] == "cudnn":
            rec.update(_time(call, e, torch))
        print(json.dumps(rec), flush=True)
    print(json.dumps({"done": names}), flush=True)
    harness.exit_child()


def _reader(proc: subprocess.Popen, tag: int, box: queue.Queue) -> None:
    for line in proc.stdout:
        try:
            box.put((tag, json.loads(line)))
        except json.JSONDecodeError:
            continue
    box.put((tag, {"eof": True}))


def _start(folder: Path, names: list[str], logs: Path, i: int, box: queue.Queue) -> subprocess.Popen:
    """Child ``i`` (``child FOLDER NAMES...``), its messages read into ``box`` tagged ``i``, its stderr in a log."""
    with open(logs / f"child{i}.err", "w") as err:  # a file: a full stderr pipe would block the child
        p = subprocess.Popen([sys.executable, __file__, "child", str(folder), *names], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
    threading.Thread(target=_reader, args=(p, i, box), daemon=True).start()
    return p


def run_all(folder: Path, out: Path, budget: float, setup_limit: float, serial: bool = False) -> int:
    """Start every child, wait until all are set up (or ``setup_limit`` s), time them one at a time in
    priority order until ``budget`` s are spent; write OUT/explicit_streamk.json and .md.

    ``serial``: one child at a time, set up and timed alone (``setup_limit`` each). The first H100 run
    (2026-11-23) set up 0 of 36 children in 30 s together: 36 contexts share the GPU by time slices, so one
    kernel that spins (a StreamK flag wait) or hangs slows every other set-up; alone, a hang costs its child.
    """
    t_start = time.time()
    manifest = harness.load_manifest(folder)
    # Timing order: the headline contenders of every problem first (the rule's split-K, StreamK tree and
    # linear), then the other split-K and CK's 128x128 tiles; cuDNN's last.
    rank = {"splitk": 0, "streamk_tree": 1, "streamk_linear": 2}
    mine = [e for e in manifest["entries"] if e["kind"] == "ours"]
    first = [e for e in mine if "_128x128" not in e["contender"] and (e["contender"].endswith("_rule")
             or e["contender"] in rank)]  # fmt: skip
    first.sort(key=lambda e: rank.get(e["contender"], 0))
    ours = [[e["name"]] for e in first] + [[e["name"]] for e in mine if e not in first]
    batches = [*ours, [e["name"] for e in manifest["entries"] if e["kind"] == "cudnn"]]
    box: queue.Queue = queue.Queue()
    procs = []
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for i, names in enumerate(batches):
        procs.append(_start(folder, names, logs, i, box))
    rows: dict[str, dict] = {}
    ready, ended, devices = set(), set(), set()
    if serial:
        return _run_serial(folder, out, batches, budget, setup_limit, manifest)

    def take(timeout: float) -> None:
        tag, msg = box.get(timeout=max(timeout, 0.01))
        if "ready" in msg:
            ready.add(tag)
            devices.add(msg.get("device", "?"))
        elif "eof" in msg or "done" in msg:
            ended.add(tag)
        elif "name" in msg:
            rows.setdefault(msg["name"], {}).update(msg)

    while len(ready | ended) < len(procs) and time.time() - t_start < setup_limit:
        try:
            take(setup_limit - (time.time() - t_start))
        except queue.Empty:
            break
    print(f"set up: {len(ready)} of {len(procs)} children in {time.time() - t_start:.1f} s", flush=True)
    for i, p in enumerate(procs):
        if i not in ready and i not in ended and p.poll() is None:
            p.kill()  # our own child, not set up in time (a hung kernel would hold the GPU)
            for n in batches[i]:
                rows.setdefault(n, {"name": n, "crashed": f"not set up in {setup_limit} s (killed)"})
    for i, p in enumerate(procs):
        if i not in ready or i in ended:
            continue
        if time.time() - t_start > budget:
            break
        p.stdin.write("go\n")
        p.stdin.flush()
        turn_end = min(time.time() + TURN_LIMIT, t_start + budget + 5)
        while i not in ended and time.time() < turn_end:
            try:
                take(turn_end - time.time())
            except queue.Empty:
                break
        if i not in ended and p.poll() is None:
            p.kill()  # our own child, past its turn (a hung kernel)
            for n in batches[i]:
                rows.setdefault(n, {"name": n}).setdefault("crashed", f"its turn took over {TURN_LIMIT} s (killed)")
        harness.write_rows(out, list(rows.values()))
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()  # our own child, past the budget
        elif p.returncode not in (0, None):
            tail = (logs / f"child{i}.err").read_text(errors="replace")[-1500:]
            for n in batches[i]:
                rows.setdefault(n, {"name": n}).setdefault("crashed", f"rc {p.returncode}: {tail}")
    for names in batches:
        for n in names:
            rows.setdefault(n, {"name": n, "untimed": "budget spent or set-up unfinished"})
    return report(list(rows.values()), manifest, out, ", ".join(sorted(devices)) or "?")


def _run_serial(folder: Path, out: Path, batches: list[list[str]], budget: float, setup_limit: float,
                manifest: dict) -> int:  # fmt: skip
    """:func:`run_all`'s serial mode: each child started, set up, checked and timed before the next."""
    t_start, rows, devices = time.time(), {}, set()
    logs = out / "logs"
    for i, names in enumerate(batches):
        if time.time() - t_start > budget:
            break
        box: queue.Queue = queue.Queue()
        p = _start(folder, names, logs, i, box)
        end, went, why = time.time() + setup_limit, False, None
        while True:
            try:
                _, msg = box.get(timeout=max(end - time.time(), 0.01))
            except queue.Empty:
                why = (
                    f"its turn took over {TURN_LIMIT} s (killed)" if went else f"not set up in {setup_limit} s (killed)"
                )
                break
            if "ready" in msg:
                devices.add(msg.get("device", "?"))
                p.stdin.write("go\n")
                p.stdin.flush()
                went, end = True, time.time() + TURN_LIMIT
            elif "name" in msg:
                rows.setdefault(msg["name"], {}).update(msg)
            elif "eof" in msg or "done" in msg:
                break
        if p.poll() is None and why:
            p.kill()  # our own child: a hung kernel would hold the GPU
        p.wait()
        for n in names:
            if why:
                rows.setdefault(n, {"name": n}).setdefault("crashed", why)
            elif n not in rows and p.returncode:
                tail = (logs / f"child{i}.err").read_text(errors="replace")[-1500:]
                rows[n] = {"name": n, "crashed": f"rc {p.returncode}: {tail}"}
        print(
            f"{time.time() - t_start:6.1f} s  {', '.join(names)[:60]}: "
            f"{[rows.get(n, {}).get('single_us') or rows.get(n, {}).get('crashed') for n in names][:3]}",
            flush=True,
        )
        harness.write_rows(out, list(rows.values()))
    for names in batches:
        for n in names:
            rows.setdefault(n, {"name": n, "untimed": "budget spent"})
    return report(list(rows.values()), manifest, out, ", ".join(sorted(devices)) or "?")


def _tiles_cell(name: str, manifest: dict) -> str:
    """``tiles (partial), MxN`` of the tiling contender ``name`` ran with (its plan's tile)."""
    e = next(e for e in manifest["entries"] if e["name"] == name)
    plan = harness.plan_of(e.get("plan"))
    if plan is None or plan.tile is None:
        return "- (no tiled plan: a host kernel of the CPU rehearsal)"
    bm, bn = plan.tile.m, plan.tile.n
    n = e["in_channels"] * math.prod(e["filter_size"])
    tiles = e["groups"] * -(-e["out_channels"] // bm) * -(-n // bn)
    k_tiles = -(-e["images"] * math.prod(e["output_size"]) // plan.tile.k)
    total = tiles * k_tiles
    w = min(manifest["sms"], total)  # workgroup i takes k iterations [i*total/w, (i+1)*total/w)
    cuts = {i * total // w for i in range(1, w)}
    partial = sum(1 for t in range(tiles) if any(t * k_tiles < c < (t + 1) * k_tiles for c in cuts))
    return f"{tiles} ({partial}), {bm}x{bn}"


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None) -> int:
    """The CK-shaped table (problem, tiles, best split-K, StreamK, speedup) and every row."""
    by = {r["name"]: r for r in rows}
    doc = {"device": device, "date": date or harness.now(), "sms": manifest["sms"], "rows": rows,
           "refused": manifest["refused"], "tiles": manifest["tiles"]}  # fmt: skip

    def ok_us(r: dict | None) -> float | None:
        return r.get("single_us") if r and r.get("correct") else None

    lines = [f"# StreamK vs split-K (explicit sm_80 kernel): {device}, {doc['date']}", "",
             "Kernel time by CUPTI, median of single calls (us); StreamK on "
             f"{manifest['sms']} workgroups; each row's tiling is its plan's (the tiling rule's, or CK's 128x128 "
             "where named), split-K and StreamK alike.", "",
             "| problem | tiles (partial) | k tiles | split-K best | us | StreamK linear us | StreamK tree us | "
             "speedup (best StreamK / best split-K) | cuDNN us |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    speedups = []

    def cell(r: dict | None) -> str:
        if r is None:
            return "-"
        if r.get("single_us") and r.get("correct"):
            return f"{r['single_us']:.1f}"
        return "WRONG" if r.get("correct") is False else ("crashed" if "crashed" in r else "-")

    for problem, info in manifest["tiles"].items():
        for suffix in ("", "_128x128"):  # the default tiling (in the geomean), CK's tile where it was run
            mine = [r for r in rows if r["name"].split(":", 1) == [r["name"].split(":")[0], problem]
                    and r["name"].split(":")[0].endswith("_128x128") == bool(suffix)]  # fmt: skip
            if not mine:
                continue
            splits = [(ok_us(r), r["name"].split(":")[0]) for r in mine if r["name"].startswith("splitk") and ok_us(r)]
            best = min(splits) if splits else (None, "-")
            lin, tree = by.get(f"streamk_linear{suffix}:{problem}"), by.get(f"streamk_tree{suffix}:{problem}")
            sks = [v for v in (ok_us(lin), ok_us(tree)) if v]
            speed = best[0] / min(sks) if sks and best[0] else None
            if speed and not suffix:
                speedups.append(speed)
            cudnn = by.get(f"cudnn:{problem}", {}).get("single_us")
            cells = [_tiles_cell(mine[0]["name"], manifest), info["k_tiles"],
                     best[1], "-" if best[0] is None else f"{best[0]:.1f}", cell(lin), cell(tree),
                     "-" if speed is None else f"{speed:.2f}x", "-" if cudnn is None else f"{cudnn:.1f}"]  # fmt: skip
            lines.append(f"| {problem} | " + " | ".join(map(str, cells)) + " |")
    geo = harness.geomean(speedups)
    doc["geomean_speedup"] = geo
    lines += ["", f"Geomean speedup over {len(speedups)} problems: {geo}", "", "## Every contender", "",
              "| contender | correct | max rel err | single us | copy us | sustained us | TFLOP/s | kernels/call |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ok = ("crashed" if "crashed" in r else "error" if "error" in r else "untimed" if "untimed" in r
              else "yes" if r.get("correct") else "WRONG")  # fmt: skip
        cells = [ok, *harness.cells(r, "max_rel_err:.2e", "single_us", "copy_us:.2f", "sustained_us", "single_tflops",
                                    "kernels_per_call")]  # fmt: skip
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    lines += harness.notes(manifest)
    return harness.write_tables(out, "explicit_streamk", doc, lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub, run = harness.command_line(__file__, __doc__, "small host kernels for a CPU rehearsal of the run side")
    run.add_argument("--budget", type=float, default=60.0, help="seconds after which no more contenders are timed")
    run.add_argument("--setup-limit", type=float, default=25.0, help="seconds to wait for the children's set-up")
    run.add_argument("--serial", action="store_true", help="one child at a time (setup-limit each)")
    harness.add_child_parser(sub, "child")
    return harness.main(ap, argv, compile=lambda a: compile_all(a.dir, a.smoke),
                        run=lambda a: run_all(a.dir, a.out, a.budget, a.setup_limit, a.serial), report=report,
                        children={"child": lambda a: child(a.dir, a.names)})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
