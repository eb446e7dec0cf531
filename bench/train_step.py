"""Whole models' training steps, torch's weight gradients against ours (issue 37): step time, host time, device
time by kind, calls, losses.

    CONVBW_ARTIFACTS=ART .venv/bin/python bench/train_step.py compile --models all --batches 64   # here: the
                             # kernels a 9.0 GPU asks for (sm_90a where it takes, sm_80 elsewhere) into ART
    CONVBW_ARTIFACTS=ART python3 bench/train_step.py run --out OUT --models all --batches 64 --modes eager  # GPU
    CONVBW_TORCH_NATIVE=1 CONVBW_ARTIFACTS=ART python3 bench/train_step.py run ...  # ours by the C++ hot path
    python3 bench/train_step.py table OUT

``run`` starts one process per model x batch x mode (a CUDA fault or an out-of-memory stays there). Inside, three
copies of the model from one seed train on the same 4 batches (bf16 autocast, channels-last, SGD lr 1e-3, momentum
0.9) in turns, step by step: torch, ours (``convbw_mlir.torch.enable(benchmark=False)``, every dW ours, on for that
step only), torch again (torch's own run-to-run spread, the yardstick); the host's drift cancels within each turn.
Per side: the median step time and the host's part of it (time to queue the step: near the step time means the host
is the bottleneck), the losses, our calls and torch's with why (``stats()``), and over 3 profiled steps the device
time by kind of kernel (ours by name, cuDNN's ``wgrad``/``dgrad`` by name, other). Modes: ``eager``, ``compile``
(``torch.compile``), ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``: CUDA graphs, ours captured in
them). Each writes OUT/<model>_<batch>_<mode>.json.
"""

from __future__ import annotations

import argparse
import json
import os
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


def compile_all(ns: argparse.Namespace) -> int:
    """Every distinct weight gradient of each model at each batch, compiled for the target a 9.0 GPU asks for,
    into $CONVBW_ARTIFACTS: from ``--problems`` (``record``'s list, taken on the GPU), else traced on the meta
    device (autocast's bf16 by hand; memory formats may differ from the device's)."""
    import torch
    from models import MODELS

    from convbw_mlir import compile_op
    from convbw_mlir import torch as ct
    from convbw_mlir.problem import ConvBwdWeightProblem

    if not os.environ.get(ct.ARTIFACTS_ENV):
        sys.exit(f"compile: set ${ct.ARTIFACTS_ENV} to the folder the GPU run will read")
    seen: dict = {}
    if ns.problems:
        for d in json.loads(ns.problems.read_text()):
            p = ConvBwdWeightProblem.from_dict(d)
            seen[p.name] = p
    else:
        for name in _models(ns.models):
            build, shape, fmt, loss, target = MODELS[name]
            for batch in sorted({_batch(name, int(b)) for b in ns.batches.split(",")}):
                model = build().to("meta", torch.bfloat16).to(memory_format=fmt)
                x = torch.empty(batch, *shape, device="meta", dtype=torch.bfloat16).contiguous(memory_format=fmt)
                with _recorder(seen):
                    loss(model(x), target(batch, None).to("meta")).backward()
    failed = 0
    for i, problem in enumerate(sorted(seen.values(), key=lambda p: p.name)):
        target = ct.cuda_target((9, 0), problem)
        folder = ct.artifact_dir(problem, target)
        status = "have"
        if not (folder / "op.json").is_file():
            try:
                compile_op(problem, target, isolate=True, output_arg=True).save(folder)
                status = "compiled"
            except Exception as e:  # a problem we cannot build stays torch's in the run: say which and why
                status, failed = f"FAILED {type(e).__name__}: {str(e)[:160]}", failed + 1
        print(f"[{i + 1}/{len(seen)}] {problem.name} {target}: {status}", flush=True)
    print(f"{len(seen)} problems, {failed} failed")
    return 0


def check(ns: argparse.Namespace) -> int:
    """On the GPU: every weight gradient of one model's step (eager, bf16 autocast, recorded as the switch sees it),
    computed again alone: by torch, by the C++ hot path ``--repeats`` times on the same memory (its CUDA graph is
    recorded by the third call and launched from C++ after; with ``$CONVBW_TORCH_NATIVE_LAUNCH=1`` the schedule is
    launched from C++ from the second call) and by the Python switch, every dW ours
    (``benchmark=False``). NaN fence: before each call a block of dW's size is filled with NaN and freed, so the
    allocator hands it to dW and a dW nobody wrote shows. The C++ path's dW must be finite and equal the Python
    path's bit for bit (the same kernel); its distance to torch's is reported (max over the entries / RMS)."""
    import torch
    from models import MODELS
    from torch.utils._python_dispatch import TorchDispatchMode

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import native

    build, shape, fmt, loss_fn, target = MODELS[ns.model]
    batch = _batch(ns.model, ns.batch)
    torch.manual_seed(0)
    model = build().cuda().to(memory_format=fmt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *shape, generator=g).cuda().contiguous(memory_format=fmt)
    y = target(batch, g).cuda()
    aten = torch.ops.aten.convolution_backward.default
    calls: list[tuple] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # noqa: ANN001, ANN204
            if func is aten and a[-1][1]:
                calls.append(tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in a[:-1]))
            return func(*a, **(kw or {}))

    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    with Record():
        loss.backward()
    del loss
    model.zero_grad(set_to_none=True)

    def dw(args: tuple) -> torch.Tensor:
        go, xx, w = args[:3]
        nbytes = w.numel() * w.element_size()
        fence = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
        del fence  # back to the allocator, NaN inside: dW is handed this block
        out = aten(*args, [False, True, False])[1]
        torch.cuda.synchronize()
        return out

    rows, ok = [], bool(calls)
    for i, args in enumerate(calls):
        ct.disable()
        want = dw(args).float()
        ct.enable(benchmark=False, native=True)
        if native.loaded() is None:
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
        ok &= finite and not differ  # graphs: direct launches only (not where x, dy or dW are copied)
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok &= sum(r["graph_launches"] + r["plain_launches"] for r in rows) > 0  # some calls launched from C++
    out = {"model": ns.model, "batch": batch, "device": torch.cuda.get_device_name(),
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


def part(ns: argparse.Namespace) -> dict:
    """One model x batch x mode, the three sides in turns (module docstring)."""
    import torch
    from models import MODELS
    from torch.profiler import ProfilerActivity, profile

    from convbw_mlir import torch as ct
    from convbw_mlir.torch import native
    from convbw_mlir.torch import switch as sw

    build, shape, fmt, loss_fn, target = MODELS[ns.model]
    batch = _batch(ns.model, ns.batch)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, *shape, generator=g).cuda().contiguous(memory_format=fmt),
                target(batch, g).cuda()) for _ in range(4)]  # fmt: skip

    def fresh():  # noqa: ANN202
        torch.manual_seed(0)
        model = build().cuda().to(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=ns.lr, momentum=0.9)

        def forward(x, y):  # noqa: ANN001, ANN202
            with torch.autocast("cuda", dtype=torch.bfloat16):
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
            torch.cuda.synchronize()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = forward(x, y)
            loss.backward()
            opt.step()
            queued = time.perf_counter() - start
            torch.cuda.synchronize()
            took = time.perf_counter() - start
        finally:
            if side in saved:
                saved[side].update(sw.decisions())
                ct.disable()
        return took, queued, loss.item()

    stats: dict[str, dict] = {s: {} for s in ours_sides}
    for i in range(ns.steps):
        for side in sides:
            ct.reset_stats()
            rows[side].append(step(side, i))
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
    device_ms = {}
    for side in ("torch", *ours_sides):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                step(side, i)
        device_ms[side] = {k: v / 3 for k, v in _kinds(prof, ours_names).items()}
    med = statistics.median
    warm = slice(ns.warmup, None)
    out = {"model": ns.model, "batch": batch, "mode": ns.mode, "device": torch.cuda.get_device_name(),
           "torch_version": torch.__version__, "steps": ns.steps, "warmup": ns.warmup, "lr": ns.lr,
           "native": native.loaded() is not None,  # CONVBW_TORCH_NATIVE=1 and it built: the C++ hot path
           "calls_per_step": {side: {k: v / (ns.steps - ns.warmup) for k, v in st.items()}
                              for side, st in stats.items()},
           "device_ms_per_step": device_ms, "kernels": ct.loaded_kernels()}  # fmt: skip
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
                stem = f"{model}_{batch}_{mode}"
                cmd = [sys.executable, __file__, "part", "--model", model, "--batch", str(batch), "--mode", mode,
                       "--steps", str(ns.steps), "--warmup", str(ns.warmup), "--lr", str(ns.lr),
                       "--sides", ns.sides, "--json", str(ns.out / f"{stem}.json")]  # fmt: skip
                start = time.time()
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
                (ns.out / f"{stem}.log").write_text(r.stdout + r.stderr)
                print(f"{stem}: exit {r.returncode} in {time.time() - start:.0f} s", flush=True)
                if r.returncode:
                    print(r.stderr[-1500:], flush=True)
    return table(ns)


def table(ns: argparse.Namespace) -> int:
    rows = [json.loads(p.read_text()) for p in sorted(ns.out.glob("*.json")) if p.name != "problems.json"]
    print("| model | batch | mode | torch ms | ours/torch | ours bench/torch | torch2/torch | host torch ms |"
          " host us/call ours, bench | calls ours (torch's: why) | bench: calls ours |"
          " device ms torch wgrad | ours: ours+wgrad | bench: ours+wgrad |"
          " loss diff ours, bench / torch2 |")  # fmt: skip
    print("|" + "---|" * 15)
    nan = float("nan")  # a side the run left out (--sides)
    for r in rows:
        dev = r["device_ms_per_step"]
        calls = r["calls_per_step"]
        why = ", ".join(f"{k.removeprefix('torch: ')} {v:g}" for k, v in calls.get("ours", {}).items() if k != "ours")
        d_t, d_o, d_b = dev["torch"], dev.get("ours", {}), dev.get("ours_bench", {})
        g = lambda key, r=r: r.get(key, nan)  # noqa: E731
        print(f"| {r['model']} | {r['batch']} | {r['mode']} | {r['torch']['step_ms']:.2f} | {g('ratio_ours'):.3f} "
              f"| {g('ratio_ours_bench'):.3f} | {g('ratio_torch2'):.3f} | {r['torch']['host_ms']:.2f} "
              f"| {g('host_us_per_call_ours'):.1f}, {g('host_us_per_call_ours_bench'):.1f} "
              f"| {calls.get('ours', {}).get('ours', 0):g} ({why or '-'}) "
              f"| {calls.get('ours_bench', {}).get('ours', 0):g} "
              f"| {d_t.get('wgrad', 0):.2f} | {d_o.get('ours', 0):.2f}+{d_o.get('wgrad', 0):.2f} "
              f"| {d_b.get('ours', 0):.2f}+{d_b.get('wgrad', 0):.2f} "
              f"| {g('loss_diff_ours'):.1e}, {g('loss_diff_ours_bench'):.1e} "
              f"/ {g('loss_diff_torch2'):.1e} |")  # fmt: skip
    if rows:
        r = rows[0]
        path = "C++ hot path (CONVBW_TORCH_NATIVE=1)" if r.get("native") else "Python switch"
        print(f"\ndevice: {r['device']}, torch {r['torch_version']}, {path}; device ms: per step, 3 profiled steps")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--models", default="all")
    c.add_argument("--batches", default="64")
    c.add_argument("--problems", type=Path, help="record's list (taken on the GPU) instead of meta tracing")
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
    pt.add_argument("--model", required=True)
    pt.add_argument("--batch", type=int, required=True)
    pt.add_argument("--mode", choices=("eager", "compile", "reduce-overhead"), required=True)
    pt.add_argument("--json", type=Path, required=True)
    ck = sub.add_parser("check")
    ck.add_argument("--model", default="resnet50")
    ck.add_argument("--batch", type=int, default=64)
    ck.add_argument("--repeats", type=int, default=5)
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
    if ns.verb == "part":
        ns.json.write_text(json.dumps(part(ns), indent=1, default=str))
        return 0
    return run(ns) if ns.verb == "run" else table(ns)


if __name__ == "__main__":
    raise SystemExit(main())
