"""Whole models' training steps, torch's weight gradients against ours (issue 37): step time, host time, device
time by kind, calls, losses.

    python3 bench/train_step.py record --models all --batches 64 --json problems.json  # GPU: the layers as seen
    CONVBW_ARTIFACTS=ART .venv/bin/python bench/train_step.py compile --problems problems.json --batches 32,64,128
                             # here: the kernels a 9.0 GPU asks for (sm_90a where it takes, sm_80 elsewhere) into
                             # ART, at every batch (--problems ART: re-batch a kernel folder; no --problems: traced
                             # on the meta device, whose memory formats may differ from the GPU's)
    CONVBW_ARTIFACTS=ART python3 bench/train_step.py check --python --model resnet50 --batch 64 --json c.json  # GPU
    CONVBW_ARTIFACTS=ART python3 bench/train_step.py run --out OUT --models all --batches 64 --modes eager  # GPU
    CONVBW_TORCH_NATIVE=1 CONVBW_ARTIFACTS=ART python3 bench/train_step.py run ...  # ours by the C++ hot path
    python3 bench/train_step.py run --device cpu --batches 1 --steps 2 --warmup 1 ...  # the same path on the CPU
    python3 bench/train_step.py table OUT

``run`` starts one process per model x batch x mode (a CUDA fault or an out-of-memory stays there; one past
``--timeout`` is killed and logged). Inside, copies of the model from one seed train on the same 4 batches (bf16
autocast, channels-last, SGD lr 1e-3, momentum 0.9) in turns, step by step (``--sides``): torch, ours
(``convbw_mlir.torch.enable(benchmark=False)``, every dW ours), the default (``enable()``: ours per layer where it
measured faster), torch again with ``cudnn.benchmark`` (torch's own run-to-run spread, the yardstick); the switch is
on for its copy's step only and the host's drift cancels within each turn. Per side: the median step time and the
host's part of it (time to queue the step: near the step time means the host is the bottleneck), the losses, our
calls and torch's with why (``stats()``), and over 3 profiled steps the device time by kind of kernel (ours by name,
cuDNN's ``wgrad``/``dgrad`` by name, other). Modes: ``eager``, ``compile`` (``torch.compile``), ``reduce-overhead``
(``torch.compile(mode="reduce-overhead")``: CUDA graphs, ours captured in them). ``--alone``: each side's steps in
a row instead of in turns (one model training alone: its memory repeats, where in turns it moves); ``--map-slots N``:
``$CONVBW_TENSOR_MAP_SLOTS`` for the ours sides (forces slot reuse). Per ours side, what the hot path did a step
(``loaded_kernels()`` deltas: tensor-map sets encoded, map slots held, CUDA graphs captured; the C++ path's launches):
the table's "hot path a step". Each writes OUT/<model>_<batch>_<mode>[_alone][_slotsN].json; ``table`` reads a
folder of them: each row's goal verdict (<= 1.00x torch's step within torch's spread), and the rows not measured with
why (a log's error or timeout, a pack's ``.skipped`` note).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEFAULT_BATCH_3D = 8


def _models(spec: str) -> list[str]:
    from models import MODELS

    names = list(MODELS) if spec == "all" else spec.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        sys.exit(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)}, all)")
    return names


def _sides(spec: str) -> str:
    sides = spec.split(",")
    if sides[0] != "torch" or not set(sides) <= {"torch", "ours", "ours_bench", "torch2"} or len(set(sides)) < 2:
        raise argparse.ArgumentTypeError(f"expected torch first, then some of ours, ours_bench, torch2; got {spec!r}")
    return spec


def _slots(spec: str) -> int:
    if not spec.isdigit() or int(spec) < 1:
        raise argparse.ArgumentTypeError(
            f"expected the tensor-map slots a kernel keeps, a whole number >= 1; got {spec!r}"
        )
    return int(spec)


def _batch(model: str, batch: int) -> int:
    return DEFAULT_BATCH_3D if model == "r3d_18" else batch


def _recorder(seen: dict):  # noqa: ANN202
    """A dispatch mode that records each ``convolution_backward`` asking for dW as the switch will see it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import switch as sw

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # noqa: ANN001, ANN204
            if func is torch.ops.aten.convolution_backward.default and a[-1][1] and not a[7]:
                go, x, w, _, stride, padding, dilation, _, _, groups, _ = a
                xd = sw._dense(x)  # the switch's own view: x dense, dy in x's format
                problem, _ = ct.problem_for(xd, w.shape, sw._like(go, xd), stride, padding, dilation, groups)
                seen[problem.name] = problem
            return func(*a, **(kw or {}))

    return Record()


def record(ns: argparse.Namespace) -> int:
    """On the GPU: one bf16 autocast step of each model with torch's kernels, every weight gradient's problem as
    the switch will see it (memory formats are the device's: e.g. GroupNorm hands NCHW to the next convolution)."""
    import torch
    from models import MODELS

    seen: dict = {}
    for name in _models(ns.models):
        build, shape, fmt, loss, target = MODELS[name]
        for batch in sorted({_batch(name, int(b)) for b in ns.batches.split(",")}):
            model = build().cuda().to(memory_format=fmt)
            x = torch.randn(batch, *shape, device="cuda").contiguous(memory_format=fmt)
            with _recorder(seen), torch.autocast("cuda", dtype=torch.bfloat16):
                out = loss(model(x), target(batch, None).cuda())
            with _recorder(seen):
                out.backward()
            del model, x, out
            torch.cuda.empty_cache()
    ns.json.write_text(json.dumps([p.to_dict() for p in seen.values()], indent=1))
    print(f"{len(seen)} problems into {ns.json}")
    return 0


# torch's two memory formats as the switch names a problem's layout (any rank): contiguous <-> channels-last
OTHER_FORMAT = {"NGCHW/GKCYX/NGKHW": "NHWGC/GKYXC/NHWGK", "NHWGC/GKYXC/NHWGK": "NGCHW/GKCYX/NGKHW"}


def _problems(source: Path, batches: list[int] | None, both_formats: bool = False) -> dict:
    """The problems of ``record``'s list (a JSON file) or of a kernel folder (``<target>/<problem>/op.json``, e.g.
    an earlier ``compile``'s), by name; with ``batches``, each at every batch of it (a 3-D problem keeps its batch:
    ``DEFAULT_BATCH_3D`` is the 3-D net's at every batch). The layers, and the memory formats the device hands them,
    do not change with the batch, so one list recorded on the GPU serves every batch. ``both_formats``: each in
    the other memory format too (torch.compile's inductor may hand a layer another format than eager did)."""
    from convbw_mlir.problem import ConvBwdWeightProblem

    if source.is_dir():
        dicts = [json.loads(f.read_text())["problem"] for f in sorted(source.glob("*/*/op.json"))]
    else:
        dicts = json.loads(source.read_text())
    seen: dict = {}
    for d in dicts:
        other = OTHER_FORMAT.get(d["layout"]) if both_formats else None
        layouts = [d["layout"]] + ([other] if other else [])
        for b in [d["batch"]] if batches is None or len(d["input_size"]) == 3 else batches:
            for layout in layouts:
                p = ConvBwdWeightProblem.from_dict(d | {"batch": b, "layout": layout})
                seen[p.name] = p
    return seen


def compile_all(ns: argparse.Namespace) -> int:
    """Every distinct weight gradient of each model at each batch, compiled for the target a 9.0 GPU asks for,
    into $CONVBW_ARTIFACTS: from ``--problems`` (``record``'s list, taken on the GPU, or a kernel folder; re-batched
    to ``--batches`` when given), else traced on the meta device (autocast's bf16 by hand; memory formats may differ
    from the device's: GroupNorm hands the next convolution NCHW on the GPU). Kernels already there are kept."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from models import MODELS

    from convbw_mlir import compile_op
    from convbw_mlir import torch as ct

    if not os.environ.get(ct.ARTIFACTS_ENV):
        sys.exit(f"compile: set ${ct.ARTIFACTS_ENV} to the folder the GPU run will read")
    if ns.problems:
        batches = None if ns.batches is None else [int(b) for b in ns.batches.split(",")]
        seen = _problems(ns.problems, batches, ns.both_formats)
    else:
        seen = {}
        for name in _models(ns.models):
            build, shape, fmt, loss, target = MODELS[name]
            for batch in sorted({_batch(name, int(b)) for b in (ns.batches or "64").split(",")}):
                model = build().to("meta", torch.bfloat16).to(memory_format=fmt)
                x = torch.empty(batch, *shape, device="meta", dtype=torch.bfloat16).contiguous(memory_format=fmt)
                with _recorder(seen):
                    loss(model(x), target(batch, None).to("meta")).backward()
    todo = sorted(seen.values(), key=lambda p: p.name)

    def one(problem) -> str:  # noqa: ANN001
        target = ct.cuda_target((9, 0), problem)
        folder = ct.artifact_dir(problem, target)
        if (folder / "op.json").is_file():
            return f"{target}: have"
        if ns.dry_run:
            return f"{target}: missing"
        try:  # isolate=True: the compile runs in a child process, so threads are enough for --jobs
            compile_op(problem, target, isolate=True, output_arg=True).save(folder)
            return f"{target}: compiled"
        except Exception as e:  # a problem we cannot build stays torch's in the run: say which and why
            return f"{target}: FAILED {type(e).__name__}: {str(e)[:160]}"

    failed = missing = 0
    with ThreadPoolExecutor(ns.jobs) as pool:
        for i, (problem, status) in enumerate(zip(todo, pool.map(one, todo))):
            print(f"[{i + 1}/{len(todo)}] {problem.name} {status}", flush=True)
            failed += "FAILED" in status
            missing += status.endswith("missing")
    print(f"{len(todo)} problems, {failed} failed" + (f", {missing} missing (--dry-run)" if ns.dry_run else ""))
    return 0


def backward_calls(model_name: str, batch: int, dev: str) -> list[tuple]:
    """The arguments of every weight gradient's ``aten.convolution_backward`` in one step of ``model_name`` (eager,
    bf16 autocast, seeded), as the switch would see them (cloned; the model's own gradients dropped)."""
    import torch
    from models import MODELS
    from torch.utils._python_dispatch import TorchDispatchMode

    build, shape, fmt, loss_fn, target = MODELS[model_name]
    torch.manual_seed(0)
    model = build().to(dev).to(memory_format=fmt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *shape, generator=g).to(dev).contiguous(memory_format=fmt)
    y = target(batch, g).to(dev)
    aten = torch.ops.aten.convolution_backward.default
    calls: list[tuple] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # noqa: ANN001, ANN204
            if func is aten and a[-1][1]:
                calls.append(tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in a[:-1]))
            return func(*a, **(kw or {}))

    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    with Record():
        loss.backward()
    del loss
    model.zero_grad(set_to_none=True)
    return calls


def check(ns: argparse.Namespace) -> int:
    """On the GPU: every weight gradient of one model's step (eager, bf16 autocast, recorded as the switch sees it),
    computed again alone: by torch, by the C++ hot path ``--repeats`` times on the same memory (its CUDA graph is
    recorded by the third call and launched from C++ after; with the native launch, on unless
    ``$CONVBW_TORCH_NATIVE_LAUNCH=0``, the schedule is launched from C++ from the second call) and by the Python
    switch, every dW ours (``benchmark=False``); with ``--python``, by the Python switch ``--repeats`` times instead
    of the C++ path (nothing to build: the path a user gets by default). NaN fence: before each call a block of dW's
    size is filled with NaN and freed, so the allocator hands it to dW and a dW nobody wrote shows. The C++ path's dW
    must be finite and equal the Python path's bit for bit (the same kernel); its distance to torch's is reported
    (max over the entries / RMS)."""
    import torch

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import native

    dev = ns.device  # cpu: the same path on the host (no allocator reuse there: the fence proves less)
    batch = _batch(ns.model, ns.batch)
    calls = backward_calls(ns.model, batch, dev)
    aten = torch.ops.aten.convolution_backward.default

    def dw(args: tuple) -> torch.Tensor:
        go, xx, w = args[:3]
        nbytes = w.numel() * w.element_size()
        fence = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device=dev)
        del fence  # back to the allocator, NaN inside: dW is handed this block
        out = aten(*args, [False, True, False])[1]
        if dev == "cuda":
            torch.cuda.synchronize()
        return out

    rows, ok = [], bool(calls)
    for i, args in enumerate(calls):
        ct.disable()
        want = dw(args).float()
        ct.enable(benchmark=False, native=not ns.python)
        if not ns.python and native.loaded() is None:
            sys.exit("check: the C++ hot path did not build")
        ct.reset_stats()
        got = []
        for _ in range(ns.repeats):
            t = dw(args)
            got.append(t.clone())
            del t
        stats, graphs, plain = ct.stats(), native.graph_launches(), native.plain_launches()
        ct.enable(benchmark=False, native=False)
        py = dw(args)
        ct.disable()
        finite = all(bool(torch.isfinite(t).all()) for t in got)
        differ = [k for k, t in enumerate(got) if not torch.equal(t, py)]
        rms = want.square().mean().sqrt().clamp_min(1e-30)
        rel = float(max((t.float() - want).abs().max() for t in got) / rms)
        row = {"layer": i, "weight": list(args[2].shape), "x": list(args[1].shape), "stats": stats,
               "graph_launches": graphs, "plain_launches": plain, "finite": finite, "differ_from_python": differ,
               "rel_vs_torch": rel}  # fmt: skip
        # graphs: direct launches only (not where x, dy or dW are copied); --python: the NaN fence (finite) decides,
        # repeats that differ are reported (a split-K reduction by atomics may not repeat bit for bit)
        ok &= finite and (ns.python or not differ)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not ns.python:
        ok &= sum(r["graph_launches"] + r["plain_launches"] for r in rows) > 0  # some calls launched from C++
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    out = {"model": ns.model, "batch": batch, "device": name, "python_only": ns.python,
           "torch_version": torch.__version__, "repeats": ns.repeats, "layers": rows, "ok": ok}  # fmt: skip
    ns.json.write_text(json.dumps(out, indent=1))
    ours = sum(1 for r in rows if r["stats"].get("ours"))
    print(f"{len(rows)} weight gradients, {ours} ours, C++ graph launches {sum(r['graph_launches'] for r in rows)}, "
          f"C++ plain launches {sum(r['plain_launches'] for r in rows)}, "
          f"max rel vs torch {max((r['rel_vs_torch'] for r in rows), default=0):.2e}; check ok: {ok}")  # fmt: skip
    return 0 if ok else 1


def _kinds(prof, ours: set[str]) -> dict[str, float]:  # noqa: ANN001
    kinds: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_time_total > 0 and e.cpu_time_total == 0 and e.key != "convbw::conv_weight":
            kind = "ours" if e.key in ours else next((k for k in ("wgrad", "dgrad") if k in e.key.lower()), "other")
            kinds[kind] = kinds.get(kind, 0.0) + e.device_time_total / 1e3  # ms
    return kinds


MAP_SLOTS_ENV = "CONVBW_TENSOR_MAP_SLOTS"  # cuda_launch.MAP_SLOTS_ENV (a wheel older than the slots lacks it)
HOT = ("maps encoded", "map slots held", "graph captures", "C++ launches")  # the hot path's counters a step


def order(sides: list[str], steps: int, alone: bool) -> list[tuple[int, str]]:
    """The (step, side) sequence: in turns, every side's step i before any side's step i + 1 (each side's memory
    moves between its calls: the other copies ran in between); ``alone``, one side's steps all in a row before the
    next side's (its memory repeats: a user's single model)."""
    if alone:
        return [(i, s) for s in sides for i in range(steps)]
    return [(i, s) for i in range(steps) for s in sides]


def hot_path(kernels: list[dict], cxx_launches: int) -> dict[str, int | None]:
    """The hot path's running totals from ``loaded_kernels()`` rows: tensor-map sets encoded, map slots held (a
    level, not a total; None from a wheel older than the slots, whose rows lack it), CUDA graphs captured;
    ``cxx_launches`` (the C++ path's graph and plain launches since ``reset_stats``) as given."""
    direct = [k for k in kernels if k.get("path") == "direct"]
    slots = (
        None if direct and not any("maps_slots" in k for k in direct) else sum(k.get("maps_slots", 0) for k in direct)
    )
    return {"maps encoded": sum(k.get("maps_encoded", 0) for k in direct), "map slots held": slots,
            "graph captures": sum(k.get("graphs", 0) for k in direct), "C++ launches": cxx_launches}  # fmt: skip


def part(ns: argparse.Namespace) -> dict:
    """One model x batch x mode, the sides in turns or ``--alone`` (module docstring)."""
    if ns.map_slots is not None:  # before any launcher exists: each reads it once (torch's sides have none)
        os.environ[MAP_SLOTS_ENV] = str(ns.map_slots)
    import torch
    from models import MODELS
    from torch.profiler import ProfilerActivity, profile

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import native
    from convbw_mlir.torch import switch as sw

    began = time.perf_counter()
    dev = ns.device  # "cpu": the same path on the host (the switch's CPU kernels), to try the bench without a GPU
    sync = torch.cuda.synchronize if dev == "cuda" else lambda: None
    build, shape, fmt, loss_fn, target = MODELS[ns.model]
    batch = _batch(ns.model, ns.batch)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, *shape, generator=g).to(dev).contiguous(memory_format=fmt),
                target(batch, g).to(dev)) for _ in range(4)]  # fmt: skip

    def fresh():  # noqa: ANN202
        torch.manual_seed(0)
        model = build().to(dev).to(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=ns.lr, momentum=0.9)

        def forward(x, y):  # noqa: ANN001, ANN202
            with torch.autocast(dev, dtype=torch.bfloat16):
                return loss_fn(model(x), y)

        if ns.mode != "eager":
            forward = torch.compile(forward, mode=None if ns.mode == "compile" else "reduce-overhead")
        return forward, opt

    sides = {s: fresh() for s in ns.sides.split(",")}  # torch first: the others are its ratios
    rows: dict[str, list] = {s: [] for s in sides}
    ours_sides = [s for s in ("ours", "ours_bench") if s in sides]
    saved: dict[str, dict] = {s: {} for s in ours_sides}  # each switch's decisions, kept across its turns
    records: dict = {}  # each ours side's switch record (its settings and memo), put back for its steps

    def step(side: str, i: int) -> tuple[float, float, float]:
        forward, opt = sides[side]
        x, y = batches[i % len(batches)]
        if ns.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        if side in saved:  # outside the timed window: the side's own switch record back, decisions and all (the
            # C++ hot path's table is an enable()'s own: a new enable() a step would decide every call anew there)
            if side in records:
                with sw._SWITCH_LOCK:
                    sw._STATE["active"] = records[side]
                    native.sync(records[side])
            else:
                ct.enable(benchmark=side == "ours_bench")
                records[side] = sw._STATE["active"]
            sw.decisions().update(saved[side])
        torch.backends.cudnn.benchmark = side == "torch2"  # torch's spread: its own other algorithms
        try:
            sync()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = forward(x, y)
            loss.backward()
            opt.step()
            queued = time.perf_counter() - start
            sync()
            took = time.perf_counter() - start
        finally:
            if side in saved:
                saved[side].update(sw.decisions())
                ct.disable()
        return took, queued, loss.item()

    stats: dict[str, dict] = {s: {} for s in ours_sides}
    hot: dict[str, dict] = {s: dict.fromkeys(HOT, 0) for s in ours_sides}
    cxx = lambda: native.graph_launches() + native.plain_launches()  # noqa: E731
    setup_s = time.perf_counter() - began
    for i, side in order(list(sides), ns.steps, ns.alone):
        ct.reset_stats()
        before = hot_path(ct.loaded_kernels(), cxx()) if side in hot else {}
        rows[side].append(step(side, i))
        if side in hot and i >= ns.warmup:  # outside the timed window: what the hot path did this step
            now = hot_path(ct.loaded_kernels(), cxx())
            for k in HOT:
                held = k == "map slots held"  # a level: the most a timed step left held
                if held:
                    hot[side][k] = None if now[k] is None else max(hot[side][k] or 0, now[k])
                else:
                    hot[side][k] += now[k] - before[k]
        if side in stats and i >= ns.warmup:  # calls of the timed steps only
            # our dW's CUDA graphs the C++ kernel launched itself (no Python): the hot path's own count
            graphs = (
                {"C++ graph launches": native.graph_launches(), "C++ plain launches": native.plain_launches()}
                if native.loaded() is not None
                else {}
            )
            for k, v in (ct.stats() | graphs).items():
                stats[side][k] = stats[side].get(k, 0) + v
    ours_names = {k for row in ct.loaded_kernels() for k in row.get("kernels", ())}
    steps_s = time.perf_counter() - began - setup_s
    device_ms = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    for side in ("torch", *ours_sides):
        with profile(activities=activities) as prof:
            for i in range(3):
                step(side, i)
        device_ms[side] = {k: v / 3 for k, v in _kinds(prof, ours_names).items()}
    med = statistics.median
    warm = slice(ns.warmup, None)
    name = torch.cuda.get_device_name() if dev == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    out = {
        "model": ns.model,
        "batch": batch,
        "mode": ns.mode,
        "device": name,
        "sides": list(sides),
        "torch_version": torch.__version__,
        "steps": ns.steps,
        "warmup": ns.warmup,
        "lr": ns.lr,
        "native": native.loaded() is not None,  # CONVBW_TORCH_NATIVE=1 and it built: the C++ hot path
        "calls_per_step": {side: {k: v / (ns.steps - ns.warmup) for k, v in st.items()} for side, st in stats.items()},
        # in turns (moving memory) or alone (repeated memory), and $CONVBW_TENSOR_MAP_SLOTS forced (None: default)
        "alone": ns.alone,
        "map_slots": ns.map_slots,
        "hot_path_per_step": {
            side: {k: v if k == "map slots held" else v / (ns.steps - ns.warmup) for k, v in h.items()}
            for side, h in hot.items()
        },  # fmt: skip
        "device_ms_per_step": device_ms,
        "kernels": ct.loaded_kernels(),
        # where a row's time went (setup: models, data, torch.compile's first traces are in the steps), for
        # the next pack's estimates
        "seconds": {"setup": setup_s, "steps": steps_s, "profile": time.perf_counter() - began - setup_s - steps_s},
    }
    for side, r in rows.items():
        out[side] = {"step_ms": med(t[0] for t in r[warm]) * 1e3, "host_ms": med(t[1] for t in r[warm]) * 1e3,
                     "loss": [t[2] for t in r], "step_s": [t[0] for t in r], "host_s": [t[1] for t in r]}  # fmt: skip
    t = rows["torch"]
    for side in (s for s in ("ours", "ours_bench", "torch2") if s in rows):
        o = rows[side]
        out[f"ratio_{side}"] = med(b[0] / a[0] for a, b in zip(t[warm], o[warm]))  # side / torch, step by step
        out[f"loss_diff_{side}"] = max(abs(a[2] - b[2]) for a, b in zip(t, o))
        if side in stats:  # (host time a step, side - torch) / our calls a step
            calls = out["calls_per_step"][side].get("ours", 0)
            out[f"host_us_per_call_{side}"] = med((b[1] - a[1]) for a, b in zip(t[warm], o[warm])) * 1e6 / max(calls, 1)
    return out


def run(ns: argparse.Namespace) -> int:
    ns.out.mkdir(parents=True, exist_ok=True)
    for model in _models(ns.models):
        for batch in sorted({_batch(model, int(b)) for b in ns.batches.split(",")}):
            for mode in ns.modes.split(","):
                stem = row_stem(model, batch, mode, ns.alone, ns.map_slots)
                cmd = [sys.executable, __file__, "part", "--model", model, "--batch", str(batch), "--mode", mode,
                       "--steps", str(ns.steps), "--warmup", str(ns.warmup), "--lr", str(ns.lr),
                       "--sides", ns.sides, "--device", ns.device, "--json", str(ns.out / f"{stem}.json")]  # fmt: skip
                cmd += ["--alone"] * ns.alone + ([] if ns.map_slots is None else ["--map-slots", str(ns.map_slots)])
                start = time.time()
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
                    log, rc = r.stdout + r.stderr, r.returncode
                except subprocess.TimeoutExpired as e:  # the child is killed: nothing of it stays on the device
                    log = "".join(t.decode(errors="replace") if isinstance(t, bytes) else t or ""
                                  for t in (e.stdout, e.stderr)) + f"\ntimed out after {ns.timeout} s\n"  # fmt: skip
                    rc = "timeout"
                (ns.out / f"{stem}.log").write_text(log)
                print(f"{stem}: exit {rc} in {time.time() - start:.0f} s", flush=True)
                if rc:
                    print(log[-1500:], flush=True)
    return table(ns)


MODES = ("eager", "compile", "reduce-overhead")
STEM = re.compile(rf"_({'|'.join(MODES)})(_alone)?(_slots\d+)?$")  # a row's file name: row_stem's


def row_stem(model: str, batch: int, mode: str, alone: bool = False, map_slots: int | None = None) -> str:
    """A row's file name: the default (in turns, the default slots) as before, the others beside it."""
    return f"{model}_{batch}_{mode}" + ("_alone" if alone else "") + ("" if map_slots is None else f"_slots{map_slots}")


def label(r: dict) -> str:
    """A row's mode as the table shows it: with ``alone`` and the forced map slots where the run asked for them."""
    slots = r.get("map_slots")
    return r["mode"] + (" alone" if r.get("alone") else "") + ("" if slots is None else f" slots={slots}")


SIDE_NAMES = {"ours": "ours (every dW)", "ours_bench": "default"}  # default: enable() on a GPU weighs each layer
KINDS = ("ours", "wgrad", "dgrad", "other")
NAN = float("nan")  # a side the run left out (--sides), or an older result without it


def goal(ratio: float, spread: float) -> str:
    """The issue's step-time goal for one row: ours <= 1.00x torch's step, within torch's own run-to-run spread
    (``torch2/torch``, how far torch's second copy lands from its first); <= 0.90x is the stronger goal."""
    if math.isnan(ratio):
        return "-"
    allowed = 1.0 + (0.0 if math.isnan(spread) else abs(spread - 1.0))
    if ratio <= 0.90:
        return "yes, <= 0.90x"
    return "yes" if ratio <= allowed else f"no (+{(ratio - allowed) * 100:.1f}%)"


def loss_rel(a: list[float], b: list[float]) -> float:
    """The largest difference of two loss curves, step by step, relative to the first's loss at that step."""
    return max((abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)), default=NAN)


def why(calls: dict[str, float]) -> str:
    """A side's calls a step that stayed torch's, by reason (``stats()``'s ``torch: ...`` keys; other counters
    such as the C++ path's graph launches are no reason)."""
    return ", ".join(f"{k.removeprefix('torch: ')} {v:g}" for k, v in calls.items() if k.startswith("torch")) or "-"


def results(folder: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    """The rows a run wrote (``part``'s JSON, ordered model, batch, mode) and the rows it started or skipped but
    did not finish: (stem, why) from a log without its JSON (its last line: the error, a timeout) or a ``.skipped``
    note (a pack's budget)."""
    rows = []
    for p in sorted(folder.glob("*.json")):
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            rows.append({"stem": p.stem, "unreadable": f"{type(e).__name__}: {e}"})
            continue
        if isinstance(r, dict) and {"model", "batch", "mode", "torch"} <= r.keys():
            rows.append(r)
    done = {row_stem(r["model"], r["batch"], r["mode"], r.get("alone", False), r.get("map_slots")) for r in rows
            if "model" in r}  # fmt: skip
    missing = [(r["stem"], r["unreadable"]) for r in rows if "unreadable" in r]
    rows = [r for r in rows if "model" in r]
    for p in sorted(folder.glob("*.log")):
        if p.stem not in done and STEM.search(p.stem):
            lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
            errors = [ln for ln in lines if re.match(r"(\w+\.)*\w*(Error|Exception)\b|timed out", ln)]
            missing.append((p.stem, (errors or lines or ["empty log"])[-1][:200]))  # the error, else the end
    for p in sorted(folder.glob("*.skipped")):
        if p.stem not in done:
            missing.append((p.stem, p.read_text().strip()[:200] or "skipped"))
    rows.sort(key=lambda r: (r["model"], r["batch"], MODES.index(r["mode"]) if r["mode"] in MODES else 9,
                             bool(r.get("alone")), r.get("map_slots") or 0))  # fmt: skip
    return rows, sorted(missing)


def render(rows: list[dict], missing: list[tuple[str, str]]) -> str:
    """The whole-model table: step times and the goal, then device time by kind, calls and losses; then the rows
    not measured and why."""
    out = ["| model | batch | mode | torch ms | torch2/torch | ours/torch | default/torch | goal (default) "
           "| host ms torch, ours, default | host us a call ours, default |",
           "|" + "---|" * 10]  # fmt: skip
    for r in rows:
        g = lambda key, r=r: r.get(key, NAN)  # noqa: E731
        host = ", ".join(f"{r.get(s, {}).get('host_ms', NAN):.2f}" for s in ("torch", "ours", "ours_bench"))
        ratio = g("ratio_ours_bench") if "ours_bench" in r else g("ratio_ours")
        out.append(f"| {r['model']} | {r['batch']} | {label(r)} | {r['torch']['step_ms']:.2f} "
                   f"| {g('ratio_torch2'):.3f} | {g('ratio_ours'):.3f} | {g('ratio_ours_bench'):.3f} "
                   f"| {goal(ratio, g('ratio_torch2'))} | {host} "
                   f"| {g('host_us_per_call_ours'):.1f}, {g('host_us_per_call_ours_bench'):.1f} |")  # fmt: skip
    out += ["", "| model | batch | mode | device ms torch: ours, wgrad, dgrad, other | ours (every dW) | default "
            "| calls a step, ours (torch's: why) | default | loss rel diff ours, default / torch2 (steps) |",
            "|" + "---|" * 9]  # fmt: skip
    for r in rows:
        dev, calls = r.get("device_ms_per_step", {}), r.get("calls_per_step", {})
        kinds = " | ".join(", ".join(f"{dev[s].get(k, 0):.2f}" for k in KINDS) if s in dev else "-"
                           for s in ("torch", "ours", "ours_bench"))  # fmt: skip
        call = " | ".join(f"{calls[s].get('ours', 0):g} ({why(calls[s])})" if s in calls else "-"
                          for s in ("ours", "ours_bench"))  # fmt: skip
        if r["mode"] == "reduce-overhead":  # a replayed CUDA graph runs our kernels without calling the switch
            call += " replays uncounted"
        loss = {
            s: loss_rel(r["torch"]["loss"], r[s]["loss"]) if s in r else NAN for s in ("ours", "ours_bench", "torch2")
        }
        out.append(f"| {r['model']} | {r['batch']} | {label(r)} | {kinds} | {call} "
                   f"| {loss['ours']:.1e}, {loss['ours_bench']:.1e} / {loss['torch2']:.1e} "
                   f"({len(r['torch']['loss'])}) |")  # fmt: skip
    counted = [r for r in rows if r.get("hot_path_per_step")]  # results older than the counters have none
    if counted:
        out += ["", "| model | batch | mode | copies | hot path a step, ours (every dW): " + ", ".join(HOT)
                + " | default |", "|" + "---|" * 6]  # fmt: skip
    for r in counted:
        hot = r["hot_path_per_step"]
        cells = " | ".join(", ".join("n/a" if hot[s].get(k) is None else f"{hot[s][k]:.3g}" for k in HOT)
                           if s in hot else "-"
                           for s in ("ours", "ours_bench"))  # fmt: skip
        copies = "alone" if r.get("alone") else "in turns"
        out.append(f"| {r['model']} | {r['batch']} | {label(r)} | {copies} | {cells} |")
    if rows:
        r = rows[0]
        path = "C++ hot path (CONVBW_TORCH_NATIVE=1)" if r.get("native") else "Python switch"
        out.append(f"\ndevice: {r['device']}, torch {r['torch_version']}, {path}; medians of the timed steps; "
                   "device ms: per step over 3 profiled steps; default: enable() (benchmark=True), ours: "
                   "enable(benchmark=False); torch2: torch again with cudnn.benchmark (its spread)")  # fmt: skip
        if counted:
            out.append("copies: in turns, each side's copy steps after the others' (its memory moves between its "
                       "calls); alone, one side's steps all in a row (a user's single model: its memory repeats). "
                       "Hot path: means over the timed steps (map slots held: the most a step left, a level; "
                       "slots=N: $CONVBW_TENSOR_MAP_SLOTS forced to N)")  # fmt: skip
    if missing:
        out.append("\nnot measured: " + "; ".join(f"{stem} ({reason})" for stem, reason in missing))
    return "\n".join(out)


def table(ns: argparse.Namespace) -> int:
    print(render(*results(ns.out)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--models", default="all")
    c.add_argument("--batches", help="comma-separated (default: 64 traced; --problems: as recorded)")
    c.add_argument("--problems", type=Path, help="record's list (taken on the GPU) or a kernel folder, not traced")
    c.add_argument("--jobs", type=int, default=1, help="compiles at a time (each in its own process)")
    c.add_argument("--both-formats", action="store_true", help="--problems: each in the other memory format too")
    c.add_argument("--dry-run", action="store_true", help="list the problems and which kernels are missing")
    rec = sub.add_parser("record")
    rec.add_argument("--models", default="all")
    rec.add_argument("--batches", default="64")
    rec.add_argument("--json", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--models", default="all")
    r.add_argument("--batches", default="64")
    r.add_argument("--modes", default="eager")
    r.add_argument("--timeout", type=int, default=900)
    for q in (r, pt := sub.add_parser("part")):
        q.add_argument("--steps", type=int, default=50)
        q.add_argument("--warmup", type=int, default=10)
        q.add_argument("--lr", type=float, default=1e-3)
        # torch2: torch's own spread; fewer sides, fewer compiles (torch.compile modes compile each side's model)
        q.add_argument("--sides", default="torch,ours,ours_bench,torch2", type=_sides)
        q.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: to try the bench here")
        q.add_argument("--alone", action="store_true", help="each side's steps in a row, not in turns (module doc)")
        q.add_argument("--map-slots", type=_slots, help=f"${MAP_SLOTS_ENV} for the ours sides (forces slot reuse)")
    pt.add_argument("--model", required=True)
    pt.add_argument("--batch", type=int, required=True)
    pt.add_argument("--mode", choices=MODES, required=True)
    pt.add_argument("--json", type=Path, required=True)
    ck = sub.add_parser("check")
    ck.add_argument("--model", default="resnet50")
    ck.add_argument("--batch", type=int, default=64)
    ck.add_argument("--repeats", type=int, default=5)
    ck.add_argument("--python", action="store_true", help="the Python switch only (no C++ hot path to build)")
    ck.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: to try the check here")
    ck.add_argument("--json", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    ns = p.parse_args(argv)
    if ns.verb == "compile":
        return compile_all(ns)
    if ns.verb == "record":
        return record(ns)
    if ns.verb == "check":
        return check(ns)
    if ns.verb in ("run", "part") and not 0 <= ns.warmup < ns.steps:
        p.error(f"--warmup: expected 0 <= warmup < --steps ({ns.steps}), got {ns.warmup}")
    if ns.verb == "run" and set(ns.modes.split(",")) - set(MODES):
        p.error(f"--modes: expected some of {', '.join(MODES)}, got {ns.modes!r}")
    if ns.verb == "part":
        tmp = ns.json.with_suffix(".json.tmp")  # a row killed mid-write leaves no half JSON for the table
        tmp.write_text(json.dumps(part(ns), indent=1, default=str))
        tmp.replace(ns.json)
        return 0
    return run(ns) if ns.verb == "run" else table(ns)


if __name__ == "__main__":
    raise SystemExit(main())
