"""The one harness of the explicit-kernel benchmarks (``bench/explicit_{gemm,conv,streamk,wavespec}.py``):
their command line (``compile`` / ``run`` / ``report`` and the child subcommands), the manifest, the child
processes of the run side (batches, a budget, a time limit a child, the JSON rows they print), and the
pieces of a check and a timing they all take (IREE's call of a vmfb, cuDNN's weight gradient, the error
against float64). A script keeps only what is its own: its problems, its contenders, its table.

How a script imports it: ``import harness``. Python puts a script's own folder first on ``sys.path`` when it
runs ``python bench/x.py``, and the children the harness starts run the same way (``sys.executable
<script> run-one ...``), so ``bench/`` needs no ``__init__.py`` and the checkout needs to be on ``PYTHONPATH``
only for ``convbw_mlir``; a script copied elsewhere takes ``harness.py`` with it. Tests put ``bench/`` on
``sys.path`` (``tests/test_bench_harness.py``).

Standard library (and the shared harness) only at import: the run side imports it on the GPU machine, where
there is no IREE compiler; torch is passed in, ``iree.runtime`` is imported where a vmfb is loaded.

The child processes (:func:`run_batches`, :func:`exit_child`, :data:`KEEP`, :func:`device_lock` ...) are the
runner's own harness, :mod:`convbw_mlir.measure.children`, re-exported here under the names the scripts use.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from convbw_mlir.measure.children import (  # noqa: F401 - the scripts' names for the shared harness
    EXIT_LINE,
    KEEP,
    device_lock,
    exit_child,
    json_rows,
    problem_row,
    run_batches,
    write_rows,
)


# -- command line ------------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """argparse with the project's CLI error: one line on stderr, exit code 1 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: error: {message}\n")


def command_line(script: str, doc: str, smoke: str, *, only: bool = False,
                 out_required: bool = False) -> tuple[Parser, Any, Parser]:  # fmt: skip
    """The parser every script starts from: ``compile DIR [--smoke] [--only ...]``, ``run DIR --out OUT``
    and ``report``. Returns (parser, its subparsers, the ``run`` parser) for the script's own options.

    Args:
        script: the script's ``__file__`` (its name is the parser's ``prog``).
        doc: the script's docstring (its first line is the description).
        smoke: the help of ``compile --smoke``.
        only: whether ``compile`` takes ``--only`` (problems whose name holds one of these).
        out_required: ``run --out`` required; else it defaults to ``$OUT`` or ``.``.
    """
    ap = Parser(prog=Path(script).name, description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--smoke", action="store_true", help=smoke)
    if only:
        c.add_argument("--only", nargs="*", help="only the problems whose name holds one of these")
    run = sub.add_parser("run")
    run.add_argument("dir", type=Path)
    if out_required:
        run.add_argument("--out", type=Path, required=True)
    else:
        run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    add_report_parser(sub)
    return ap, sub, run


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """``report DIR ROWS --out OUT --device D [--date T]``: the tables again from a (cut-off) run's rows."""
    rep = sub.add_parser("report", help="tables from a (cut-off) run's rows.json")
    rep.add_argument("dir", type=Path)
    rep.add_argument("rows", type=Path)
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--device", required=True)
    rep.add_argument("--date", default=None)
    return rep


def add_child_parser(sub: Any, name: str = "run-one") -> argparse.ArgumentParser:
    """``<name> DIR NAMES...``: the subcommand a child runs (the contenders ``NAMES`` of ``DIR``'s manifest)."""
    child = sub.add_parser(name)
    child.add_argument("dir", type=Path)
    child.add_argument("names", nargs="+")
    return child


def add_batch_options(run: Any, budget: float, child_limit: float | None = None) -> None:
    """``run``'s options of :func:`run_batches`: ``--budget``, ``--jobs`` (and ``--child-limit``). One child at a
    time unless ``--jobs`` says otherwise: the figures a claim quotes come from runs no other worker shares."""
    run.add_argument("--budget", type=float, default=budget, help="seconds after which nothing new starts")
    run.add_argument("--jobs", type=int, default=1, help="children at once (their set-up overlaps; default 1)")
    if child_limit is not None:
        run.add_argument(
            "--child-limit", type=float, default=child_limit, help="seconds after which a child is stopped"
        )


def main(ap: Parser, argv: list[str] | None, *, compile: Callable[[Any], None], run: Callable[[Any], int],
         report: Callable[..., int], children: dict[str, Callable[[Any], None]] | None = None) -> int:  # fmt: skip
    """Parse ``argv`` and do it: ``compile(args)``, ``run(args)``, ``report(rows, manifest, out, device,
    date)``, or a child subcommand (``children[cmd](args)``), which then leaves by :func:`exit_child`."""
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile(a)
        return 0
    if a.cmd == "run":
        return run(a)
    if a.cmd == "report":
        return report(json.loads(a.rows.read_text()), load_manifest(a.dir), a.out, a.device, a.date)
    (children or {})[a.cmd](a)
    exit_child()


# -- files -------------------------------------------------------------------------------------------
def load_manifest(folder: Path) -> dict[str, Any]:
    """``folder/manifest.json``, as the compile side wrote it."""
    return json.loads((folder / "manifest.json").read_text())


def split_manifest(folder: Path, parts: int) -> int:
    """``folder``'s manifest in ``parts`` manifests (``<folder>.partI/manifest.json``, in its order, the kernels left
    in ``folder`` by absolute path), so a run cut short keeps whole parts."""
    man = load_manifest(folder)
    rows = man["problems"]
    size = -(-len(rows) // parts)
    for i in range(parts):
        sub = folder.parent / f"{folder.name}.part{i}"
        sub.mkdir(exist_ok=True)
        chunk = rows[i * size : (i + 1) * size]
        for entry in chunk:
            for rec in entry["contenders"].values():
                for k in ("vmfb", "launch"):
                    if rec.get(k) and not Path(rec[k]).is_absolute():
                        rec[k] = str((folder / rec[k]).resolve())
        (sub / "manifest.json").write_text(json.dumps({**man, "problems": chunk}, indent=1) + "\n")
        print(sub)
    return 0


def probe_main(argv: list[str] | None, doc: str, name: str, parts: int, compile_all: Callable[..., int],
               report: Callable[[list[Path], Path], int]) -> int:  # fmt: skip
    """The command line of a side-by-side probe pack (bench/thin90.py, bench/rankfold.py): ``compile OUT`` here
    (``compile_all(out, workers, cache)``), ``split FOLDER`` into ``parts`` (:func:`split_manifest`) and ``report
    RESULTS... --manifest M`` (``report``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("out", type=Path)
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--cache", type=Path, default=Path(f".art/{name}_cache"))
    s = sub.add_parser("split")
    s.add_argument("folder", type=Path)
    s.add_argument("--parts", type=int, default=parts)
    r = sub.add_parser("report")
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--manifest", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        return compile_all(args.out, args.workers, args.cache)
    if args.cmd == "split":
        return split_manifest(args.folder, args.parts)
    return report(args.results, args.manifest)


def print_report(results: list[Path], manifest: Path, summarize: Callable[[list[dict], dict], Any],
                 report_lines: Callable[[Any], list[str]]) -> int:  # fmt: skip
    """A probe's tables: ``report_lines(summarize(rows, manifest))`` of the runner's part files (their rows, in
    order) and the compile side's manifest, printed."""
    rows = [r for f in results for r in json.loads(f.read_text())["problems"]]
    print("\n".join(report_lines(summarize(rows, json.loads(manifest.read_text())))))
    return 0


def compile_manifest(out: Path, items: list[tuple[str, Any, list[Any], dict[str, Any]]], workers: int,
                     cache: Path | None, target: str = "sm_90a") -> int:  # fmt: skip
    """Build each ``(name, problem, variants, extra)`` of ``items`` for ``target`` into ``out`` (written whole or
    not at all) as the runner's manifest: keys ``NNN-name.dtype``, the first variant the plan's own, no GPU
    reference (the runner checks against float64), ``extra`` the entry's extra fields; prints the build's table."""
    from convbw_mlir.dispatch.build import Registry
    from convbw_mlir.dispatch.tune import write_candidate, write_manifest
    from convbw_mlir.files import atomic_directory
    from convbw_mlir.measure.records import ManifestEntry

    reg = Registry(target, cache)
    for name, p, vs, _ in items:
        for v in vs:
            reg.declare(p, v)
        print(f"{name} {p.dtype}: {len(vs)} kernels: {', '.join(v.name for v in vs)}", flush=True)
    report = reg.build(max_workers=workers, progress=False)
    by = {(r.problem, r.variant): r for r in report.results}
    entries = []
    with atomic_directory(out) as tmp:
        for i, (name, p, vs, extra) in enumerate(items):
            key = f"{i:03d}-{name}.{p.dtype}"
            contenders: dict[str, Any] = {"reference": {"ok": False, "error": "not built (float64 checks)"}}
            for j, v in enumerate(vs):
                contenders[v.name] = write_candidate(tmp, f"{key}.v{j}", v, by[(p, v)], heuristic=j == 0)
            entries.append(ManifestEntry(name, key, p.to_dict(), contenders, extra).to_dict())
        write_manifest(tmp, target, entries, report)
    print(report.table())
    return 0


def result_seconds(res: dict[str, Any]) -> float | None:
    """A contender's time in a results row: its kernel time where it has one, else its call's; None unless ok."""
    if res.get("status") != "ok":
        return None
    return res.get("kernel_s") or res.get("median_s")


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """``folder/manifest.json``, whole or not at all (a temporary file renamed)."""
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(folder / "manifest.json")


def write_tables(out: Path, stem: str, doc: dict[str, Any], lines: list[str]) -> int:
    """``OUT/<stem>.json`` (``doc``) and ``OUT/<stem>.md`` (``lines``), printed as well; returns 0."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


def now() -> str:
    """The date of a run's tables."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


# -- compile side ------------------------------------------------------------------------------------
def problem_fields(p: Any) -> dict[str, Any]:
    """The geometry a run side rebuilds the problem from (``p``: a ConvBwdWeightProblem), and its flops."""
    return {
        "images": p.batch,
        "groups": p.groups,
        "in_channels": p.in_channels,
        "out_channels": p.out_channels,
        "input_size": list(p.input_size),
        "output_size": list(p.output_size),
        "filter_size": list(p.filter_size),
        "stride": list(p.stride),
        "dilation": list(p.dilation),
        "pad": list(p.pad_low),
        "dw_dtype": p.dw_dtype,
        "flops": 2 * p.groups * p.out_channels * p.in_channels * math.prod(p.filter_size) * p.batch
        * math.prod(p.output_size),
    }  # fmt: skip


# -- run side: the parent ----------------------------------------------------------------------------
def gpu_name() -> str | None:
    """The GPU's name by nvidia-smi, None where it gives none."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def device_name(device: str) -> str:
    """The GPU's name, or ``cpu`` for a rehearsal (``device`` is the script's torch device)."""
    if device != "cuda":
        return "cpu"
    return gpu_name() or "cuda (nvidia-smi gave no name)"


def rows_by_problem(rows: Iterable[dict]) -> dict[str, dict[str, dict]]:
    """The children's rows as problem -> kind -> row (the report tables' lookup)."""
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["problem"], {})[r["kind"]] = r
    return by


def plan_of(data: dict | None) -> Any:
    """The :class:`convbw_mlir.plan_data.Plan` of a manifest entry's plain-data ``plan``, None for none (a
    contender without a plan: cuDNN, IREE's forms, a host kernel of a CPU rehearsal).

    Raises:
        PlanError: a malformed plan, naming the entry and value.
    """
    from convbw_mlir.plan_data import Plan

    return Plan.from_dict(data) if data else None


def tile_split(plan: Any, k: bool = False) -> str | None:
    """``MxN, k_batch`` (``MxNxK, k_batch`` with ``k``) of a plan with a tile, None for one without."""
    if plan is None or plan.tile is None:
        return None
    t = plan.tile
    return f"{t.m}x{t.n}{f'x{t.k}' if k else ''}, {plan.k_batch}"


def manifest_plans(manifest: dict) -> dict[tuple[str, str], Any]:
    """(problem, kind) -> the plan each entry of a manifest was compiled with (a ``Plan``, or None)."""
    return {(e["problem"], e["kind"]): plan_of(e["plan"]) for e in manifest["entries"]}


# -- run side: a child -------------------------------------------------------------------------------
def nchw_inputs(e: dict, seed: int, device: str, torch: Any) -> tuple[Any, Any]:
    """dy ``[N, G*K, Ho, Wo]`` and x ``[N, G*C, H, W]`` of entry ``e``, f16, seeded, on ``device``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dy = torch.randn(e["images"], e["groups"] * e["out_channels"], *e["output_size"], generator=g)
    x = torch.randn(e["images"], e["groups"] * e["in_channels"], *e["input_size"], generator=g)
    return dy.half().to(device), x.half().to(device)


def conv2d_weight(e: dict, x: Any, dy: Any, torch: Any) -> Any:
    """cuDNN's weight gradient of entry ``e`` (NCHW ``x`` and ``dy``), ``[G*K, C, Y, X]``, in their type;
    a 1-D or 3-D entry (NCW, NCDHW) goes to ``conv1d_weight`` / ``conv3d_weight``."""
    shape = (e["groups"] * e["out_channels"], e["in_channels"], *e["filter_size"])
    grad = getattr(torch.nn.grad, f"conv{len(e['filter_size'])}d_weight")
    return grad(x, shape, dy, stride=e["stride"], padding=e["pad"], dilation=e["dilation"], groups=e["groups"])


def iree_call(vmfb: Path, function: str, device: str, *arrays: Any) -> Callable[[], Any]:
    """A call of ``function`` of ``vmfb`` on copies of the host ``arrays`` resident on the device (CUDA, or
    local-task for a CPU rehearsal); the runtime's objects are kept in KEEP."""
    import iree.runtime as rt

    dev = rt.get_driver("cuda" if device == "cuda" else "local-task").create_default_device()
    config = rt.Config(device=dev)
    module = rt.VmModule.copy_buffer(config.vm_instance, vmfb.read_bytes())
    fn = rt.load_vm_module(module, config)[function]
    args = [rt.asdevicearray(dev, a) for a in arrays]
    KEEP.append((dev, config, module, fn, args))
    return lambda: fn(*args)


def check(got: Any, exact: Any, dw_dtype: str, torch: Any, rms: bool = True) -> dict[str, Any]:
    """``max_rel_err`` (over the largest exact entry), ``rms_rel_err`` (where ``rms``), ``tolerance`` and
    ``correct`` of a result ``got`` against the float64 ``exact`` (torch tensors on the host)."""
    err = (got - exact).abs()
    rec: dict[str, Any] = {"max_rel_err": err.max().item() / max(exact.abs().max().item(), 1e-30)}
    if rms:
        rec["rms_rel_err"] = (err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()
    # f32 accumulation of f16 products; an f16 result adds its rounding (2^-11 of the largest entry), bf16 2^-8.
    rec["tolerance"] = {"f32": 1e-3, "bf16": 2.0**-8}.get(dw_dtype, 2e-3)
    rec["correct"] = bool(rec["max_rel_err"] <= rec["tolerance"]) and bool(torch.isfinite(got).all())
    return rec


def activities(torch: Any, device: str, cpu: bool = True) -> list[Any]:
    """What torch.profiler records: the GPU's activities through CUPTI, and the CPU's where ``cpu`` or in a
    rehearsal (``device`` is not ``cuda``)."""
    kinds = [torch.profiler.ProfilerActivity.CPU] if cpu or device != "cuda" else []
    return kinds + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])


def profile_calls(call: Callable[[], Any], done: Callable[[Any], Any], torch: Any, kinds: list[Any], singles: int,
                  stream: int, read: Callable[[Path], Any], settle: float = 0.0) -> tuple[Any, float]:  # fmt: skip
    """Three calls to warm up, then one profiler session (its start and stop cost more than the calls):
    ``singles`` calls 10 ms apart, each waited for (``done``), then, ``settle`` s later, ``stream`` calls
    back to back, all holding the GPU alone (:func:`device_lock`). Returns ``read(trace)`` of the session's
    chrome trace and the stream's wall s a call."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        with device_lock().timing():
            for _ in range(3):
                r = call()
            done(r)
            with torch.profiler.profile(activities=kinds) as prof:
                for _ in range(singles):
                    done(call())
                    time.sleep(0.01)  # a pause: the clocks recover between calls
                time.sleep(settle)
                t0 = time.perf_counter()
                for _ in range(stream):
                    r = call()
                done(r)
                wall = (time.perf_counter() - t0) / stream
        prof.export_chrome_trace(str(trace))
        return read(trace), wall


def calls(events: list[tuple], gap_us: float) -> list[list[tuple]]:
    """GPU events ``(start us, duration us, ...)`` grouped into calls: the single calls of a timing are
    separated by pauses far longer than ``gap_us``."""
    out: list[list[tuple]] = []
    end = -math.inf
    for ev in events:
        if ev[0] - end > gap_us:
            out.append([])
        out[-1].append(ev)
        end = max(end, ev[0] + ev[1])
    return out


def tflops(flops: float, us: float | None) -> float | None:
    """TFLOP/s of ``flops`` in ``us`` microseconds (None without a time)."""
    return flops / (us * 1e-6) / 1e12 if us else None


# -- report --------------------------------------------------------------------------------------------
def cell(v: Any, spec: str = "{:.1f}") -> str:
    """A table cell: ``v`` formatted by ``spec``, ``-`` for None."""
    return "-" if v is None else spec.format(v)


def cells(r: dict, *keys: str) -> list[str]:
    """Row ``r``'s values at ``keys`` as table cells (``key:spec``: a format spec other than ``.1f``)."""
    out = []
    for key in keys:
        name, _, spec = key.partition(":")
        out.append(cell(r.get(name), "{:" + (spec or ".1f") + "}"))
    return out


def notes(manifest: dict, rows: Iterable[dict] = (), wall: float | None = None, wrong: bool = False) -> list[str]:
    """A report's closing lines: each row that crashed, was skipped or raised an error (with ``wrong``,
    each wrong one too), each contender the compile side refused, the run's wall time (where given)."""
    lines = []
    for r in rows:
        for key in ("crashed", "skipped", "error"):
            if key in r:
                lines.append(f"- `{r['name']}` {key}: {str(r[key])[-300:]}")
        if wrong and "correct" in r and not r["correct"]:
            lines.append(f"- `{r['name']}` WRONG: max rel. error {r.get('max_rel_err')}")
    lines += [f"- refused `{k}`: {v}" for k, v in manifest["refused"].items()]
    if wall is not None:
        lines += ["", f"Run wall time: {wall:.0f} s."]
    return lines


def geomean(values: list[float]) -> float | None:
    """The geometric mean, None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
