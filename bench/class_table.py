"""Issue 40's per-class table: the product's untuned sm_90a plan against cuDNN, class by class, f16 and bf16.

    .venv/bin/python bench/class_table.py select [--per-class 8] [--classes thin]  # here: the problems, no compiler
    .venv/bin/python bench/class_table.py compile DIR [--per-class 8] [--classes thin] [--workers 2]  # here (IREE)
    python3 bench/class_table.py run DIR --out OUT [--deadline S]                # GPU machine: runtime and torch
    python bench/class_table.py report OUT/rows.jsonl [--card CARD] [--command CMD] > table.md

The problems (:func:`select`): every layer of the classes suite (``convbw_mlir/suites/classes.tsv``), the two
layers issue 40 names that no suite holds (:data:`ISSUE`) and, per class, up to ``--per-class`` layers of the zoo
suite (``zoo.tsv``): those of held-back models first
(``bench/zoo_split.json``: every model of the layer held out of tuning), then the others, each part in the order
of sha256(:data:`SEED`, name), fixed before any timing. A problem's class comes from its shape alone
(:func:`problem_class`), the suite's own and the zoo's layers alike. Each problem runs in f16 and bf16,
channels-last, the plan ``decide(problem, "sm_90a")`` gives with no tuning database (the heuristic's).

The order (:func:`round_robin`): one problem of every class in turn (its f16 and bf16 rows together), the
classes suite's and the zoo's layers alternating within a class, so that a run cut short still holds every class.
``--classes`` (:func:`known_classes`) keeps only some classes' rows of that order, with the full table's keys, so
that a class re-run compares row by row with the whole table.
``run`` is the product's runner in its one-process-a-device form (:mod:`convbw_mlir.measure.run` ``server=True``):
every kernel checked against float64 (the runner's sample) with NaN after x and dy, then timed by CUPTI, cuDNN
checked and timed in the same process after it, one timing at a time; each finished row is appended to
``OUT/rows.jsonl`` as it comes. Where the plan is the GEMV kernel, the plan the GEMV rule replaced
(``switches.GEMV_BY_DEFAULT`` off: :data:`BEFORE`) is timed beside it, the rule's own check. ``report`` groups the
rows by class: cuDNN/ours per layer, the geomean, the minimum, the layers below 0.5x, f16 time over bf16 time, each
against the issue's goals (:data:`GOALS`), and the GEMV kernel against the plan before it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Parser, geomean  # noqa: E402

TARGET = "sm_90a"
TYPES = ("f16", "bf16")
SEED = "classtable"
SPLIT = Path(__file__).with_name("zoo_split.json")
# Zoo layers a class by default: 8 classes x (suite + 8 zoo) x 2 types fit one pack's ~300 s of timing.
PER_CLASS = 8
# The classes of issue 40, in the order of a round (dense last: the reference, not a goal of the issue).
CLASSES = ("first", "conv1d", "conv3d", "dw", "thin", "medium", "gemv", "dense")
THIN_MAX = 16  # channels a group (in and out) at most: thin groups (ResNeXt 32x4d/32x8d, RegNetX-400MF's 16)
GEMV_MAX_CHANNELS = 8  # out channels at most: GEMV-like (the GEMV kernel's MAX_NARROW)
TINY_ROWS = 256  # images x output positions at most: a tiny reduction (squeeze-excitation 1x1 maps, one image)
FIRST_MAX_C = 4  # in channels at most: a first layer (RGB, RGBA, grey)
# cuDNN/ours: a class's geomean at least, every layer at least; depthwise's geomean; bf16 vs f16 (issue 40)
# Layers issue 40 names that neither suite holds: Mamba's causal depthwise conv, CK's test list's 3-D K = 1 case.
ISSUE = {"mamba_causal_dw4_1d": "1 1536 8 1 1 4 2048 1 1 3 0",
         "ck_test_3d_k1_c32": "3 1 1 1 32 3 3 3 32 32 32 1 1 1 1 1 1 1 1 1 1 1 1"}  # fmt: skip
GOALS = {"geomean": 0.9, "floor": 0.5, "dw_geomean": 1.0, "f16_vs_bf16": 1.10}


def problem_class(p: Any) -> str:
    """The class of a problem by its shape, first rule that holds:

    ``dw``: one in and one out channel a group, several groups (any rank: 2-D, 1-D causal, 3-D);
    ``thin`` / ``medium``: other grouped layers, at most :data:`THIN_MAX` channels a group in and out, or wider;
    ``gemv``: at most :data:`GEMV_MAX_CHANNELS` out channels, or at most :data:`TINY_ROWS` images x output
    positions (squeeze-excitation, one image of a small map; CK's 3-D case with K = 1);
    ``conv1d`` / ``conv3d``: the other 1-D and 3-D layers (wav2vec 2.0's C = 1 stem and R3D's stem included);
    ``first``: 2-D with at most :data:`FIRST_MAX_C` in channels; ``dense``: the rest.
    """
    if p.groups > 1 and p.in_channels == 1 and p.out_channels == 1:
        return "dw"
    if p.groups > 1:
        return "thin" if max(p.in_channels, p.out_channels) <= THIN_MAX else "medium"
    if p.out_channels <= GEMV_MAX_CHANNELS or p.batch * math.prod(p.output_size) <= TINY_ROWS:
        return "gemv"
    if p.rank == 1:
        return "conv1d"
    if p.rank == 3:
        return "conv3d"
    if p.in_channels <= FIRST_MAX_C:
        return "first"
    return "dense"


class Pick(NamedTuple):
    """One selected layer: its name, class, source suite, whether its models are all held back, the problem (f16)."""

    name: str
    cls: str
    source: str
    held_out: bool
    problem: Any


def _order_key(name: str) -> str:
    return hashlib.sha256(f"{SEED}\0{name}".encode()).hexdigest()


def select(per_class: int = PER_CLASS, suite: Iterable[tuple[str, Any]] | None = None,
           zoo: Iterable[tuple[str, Any]] | None = None, models: dict[str, list[str]] | None = None,
           held: Iterable[str] | None = None, extra: bool = True) -> dict[str, list[Pick]]:  # fmt: skip
    """Class -> its layers (the suite's, then the zoo's chosen ones), see the module docstring. The arguments
    default to the shipped suites, the zoo's model comments and ``bench/zoo_split.json``'s held-out models;
    ``extra``: the layers issue 40 names that no suite holds (:data:`ISSUE`) join the suite's.

    Raises:
        ValueError: ``per_class`` not a count >= 0.
    """
    from convbw_mlir.problem import ConvBwdWeightProblem

    if not isinstance(per_class, int) or isinstance(per_class, bool) or per_class < 0:
        raise ValueError(f"per_class: expected a count >= 0, got {per_class!r}")
    if suite is None or zoo is None or models is None or held is None:
        from convbw_mlir.dispatch import generalize
        from convbw_mlir.suites import load_suite

        suite = load_suite("classes") if suite is None else suite
        zoo = load_suite("zoo") if zoo is None else zoo
        models = generalize.read_models("zoo") if models is None else models
        held = generalize.read_split(SPLIT)["held_out"] if held is None else held
    held_set = set(held)
    out: dict[str, list[Pick]] = {c: [] for c in CLASSES}
    for name, p in suite:
        out[problem_class(p)].append(Pick(name, problem_class(p), "classes", False, p))
    for name, line in (ISSUE if extra else {}).items():
        p = ConvBwdWeightProblem.from_ck(line)
        out[problem_class(p)].append(Pick(name, problem_class(p), "issue", False, p))
    zoo_by: dict[str, list[Pick]] = {c: [] for c in CLASSES}
    for name, p in zoo:
        ms = models.get(name, [])
        zoo_by[problem_class(p)].append(Pick(name, problem_class(p), "zoo", bool(ms) and set(ms) <= held_set, p))
    for c, picks in zoo_by.items():
        out[c] += spread(picks, models)[:per_class]
    return out


def spread(picks: list[Pick], models: dict[str, list[str]]) -> list[Pick]:
    """Held-out layers first, then the others; within each, one layer of every model in turn (a model's layers and
    the models in the order of sha256(:data:`SEED`, name)), so that a few picks span several models."""
    by_model: dict[str, list[Pick]] = {}
    for k in sorted(picks, key=lambda k: _order_key(k.name)):
        by_model.setdefault(min(models.get(k.name) or ["-"]), []).append(k)
    rank = {k.name: (i, _order_key(m)) for m, ks in by_model.items() for i, k in enumerate(ks)}
    return sorted(picks, key=lambda k: (not k.held_out, *rank[k.name], _order_key(k.name)))


def round_robin(by_class: dict[str, list[Pick]]) -> list[Pick]:
    """Every class's layers in turns of one a class (:data:`CLASSES` order); within a class the suite's and the
    zoo's layers alternate (the suite's first), so that a prefix of the order holds every class."""
    lanes = []
    for c in CLASSES:
        picks = by_class.get(c, [])
        suite = [k for k in picks if k.source != "zoo"]
        zoo = [k for k in picks if k.source == "zoo"]
        lane = [k for pair in zip(suite, zoo) for k in pair]
        lanes.append(lane + suite[len(lane) // 2 :] + zoo[len(lane) // 2 :])
    out = []
    for i in range(max((len(lane) for lane in lanes), default=0)):
        out += [lane[i] for lane in lanes if i < len(lane)]
    return out


def known_classes(names: Iterable[str]) -> tuple[str, ...]:
    """The classes named (each once, in :data:`CLASSES` order).

    Raises:
        ValueError: a name that is not a class (the known ones listed), or no name at all.
    """
    names = [n.strip() for n in names]
    unknown = [n for n in names if n not in CLASSES]
    if unknown or not names:
        got = ",".join(unknown) if unknown else "(none)"
        raise ValueError(f"classes: unknown class {got!r}; known: {', '.join(CLASSES)}")
    return tuple(c for c in CLASSES if c in names)


def entries(per_class: int = PER_CLASS, types: tuple[str, ...] = TYPES, classes: Iterable[str] | None = None,
            **kw: Any) -> list[tuple[str, Pick, Any]]:  # fmt: skip
    """(manifest key, pick, problem in that type) in the measuring order: each layer's types together. ``classes``:
    only those classes' rows, keyed and ordered as in the whole table (the key's number is the layer's place in
    the whole round-robin order), so that their rows compare one to one."""
    keep = None if classes is None else set(known_classes(classes))
    out = []
    for i, k in enumerate(round_robin(select(per_class, **kw))):
        if keep is not None and k.cls not in keep:
            continue
        for t in types:
            out.append((f"{i:03d}-{k.name}.{t}", k, k.problem.with_(dtype=t, dw_dtype=t, layout=2)))
    return out


def kernel_of(plan: dict[str, Any] | None) -> str:
    """The kernel a plan (``Plan.to_dict``) runs, in a word or two."""
    if not plan:
        return "-"
    if plan.get("gemv"):
        return "gemv"
    if plan.get("depthwise"):
        return "depthwise"
    tile = plan.get("tile") or {}
    word = {"NV_WGMMA": "wgmma", "NV_MMA_SYNC": "mma.sync"}
    kind = next((w for k, w in word.items() if str(tile.get("intrinsic", "")).startswith(k)), None)
    if kind is None:
        return str(plan.get("strategy", "-"))
    bits = [kind]
    if plan.get("merge"):
        bits.append(f"merge {plan['merge'].get('groups')}")
    if plan.get("streamk"):
        bits.append("streamk")
    elif (plan.get("split") or {}).get("k_batch", 1) > 1:
        bits.append(f"split {plan['split']['k_batch']}")
    return " ".join(bits)


# -- compile side (here: the IREE compiler) -------------------------------------------------------------------
# The contender beside the GEMV kernel: the plan with the GEMV rule off (switches.GEMV_BY_DEFAULT), what it replaced.
BEFORE = "before_gemv"


def plan_without_gemv(p: Any) -> Any:
    """The sm_90a plan ``decide`` gives with the GEMV rule off (the switch restored after)."""
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import switches

    was = switches.GEMV_BY_DEFAULT
    switches.GEMV_BY_DEFAULT = False
    try:
        return decide(p, TARGET)
    finally:
        switches.GEMV_BY_DEFAULT = was


def compile_all(folder: Path, per_class: int, workers: int, timeout: float, cache: str | None,
                classes: Iterable[str] | None = None) -> int:  # fmt: skip
    """The heuristic's sm_90a kernel of every entry (``classes``: of those classes only) into ``folder`` (one
    manifest in the measuring order; built beside and moved into place whole). A plan that is refused or fails to
    build is a record, not the end."""
    from importlib.metadata import version

    from convbw_mlir.dispatch.build import Registry
    from convbw_mlir.dispatch.tune import write_candidate
    from convbw_mlir.dispatch.variants import Variant, heuristic
    from convbw_mlir.files import atomic_directory
    from convbw_mlir.measure.records import ManifestEntry

    chosen = CLASSES if classes is None else known_classes(classes)
    todo = entries(per_class, classes=chosen)
    reg = Registry(TARGET, cache)
    variants: dict[str, Any] = {}
    before: dict[str, Any] = {}
    for key, _, p in todo:
        try:
            variants[key] = heuristic(p, TARGET)
        except ValueError as e:  # PlanError is a ValueError: the plan refuses it (a result of the table)
            variants[key] = str(e).splitlines()[0][:300] or type(e).__name__
            continue
        reg.declare(p, variants[key])
        plan = variants[key].plan
        if plan is not None and plan.gemv is not None:
            before[key] = Variant("convbw", plan_without_gemv(p), (), "before")
            reg.declare(p, before[key])
    t0 = time.monotonic()
    report = reg.build(max_workers=workers, timeout=timeout, progress=False)
    built = {(r.problem, r.variant): r for r in report.results}
    with atomic_directory(folder) as tmp:
        rows = []
        for key, k, p in todo:
            v = variants[key]
            if isinstance(v, str):
                rec: dict[str, Any] = {"ok": False, "error": f"plan: {v}"}
            else:
                rec = write_candidate(tmp, key, v, built[(p, v)], heuristic=True)
                rec["config"] = {"kernel": kernel_of(v.plan.to_dict() if v.plan else None), "target": TARGET}
            contenders = {"convbw": rec}
            if key in before:  # the plan the GEMV rule replaced, timed beside it: the rule's own check
                b = before[key]
                contenders[BEFORE] = write_candidate(tmp, f"{key}.before", b, built[(p, b)], heuristic=False)
                contenders[BEFORE]["config"] = {"kernel": kernel_of(b.plan.to_dict()), "target": TARGET}
            extra = {"class": k.cls, "source": k.source, "held_out": k.held_out}
            rows.append(ManifestEntry(k.name, key, p.to_dict(), contenders, extra).to_dict())
        manifest = {"target": TARGET, "date": time.strftime("%Y-%m-%d"), "iree_version": version("iree-base-compiler"),
                    "per_class": per_class, "classes": list(chosen), "problems": rows}  # fmt: skip
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    bad = [(e["key"], e["contenders"]["convbw"]["error"]) for e in rows if not e["contenders"]["convbw"]["ok"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} kernels in {time.monotonic() - t0:.0f} s ({workers} workers)")
    for key, err in bad:
        print(f"  not built: {key}: {err[:200]}")
    return 0


# -- run side (GPU machine: runtime, torch) ----------------------------------------------------------------
def run(folder: Path, out: Path, fields: tuple[str, ...] = ("class", "source", "held_out")) -> int:
    """The runner's server over the manifest, in its order; each finished row appended to ``out/rows.jsonl``
    (a run cut short keeps its rows), the whole results in ``out/results.json`` and the table at the end.
    ``fields``: the manifest entries' extra fields each row carries (the runner's rows have none of them).
    Checked on the runner's float64 sample (``numpy_max_flops`` 0): numpy's whole float64 dW of the large layers
    costs seconds of CPU a problem that the pack's budget does not have."""
    from convbw_mlir.measure import run as runner

    out.mkdir(parents=True, exist_ok=True)
    rows = out / "rows.jsonl"
    rows.unlink(missing_ok=True)
    line = runner._line
    # the runner's rows carry no entry fields of ours: they are added from the manifest
    extra = {e["key"]: {k: e[k] for k in fields if k in e}
             for e in runner.read_manifest(folder)["problems"]}  # fmt: skip

    def logged(row: Any) -> str:  # the runner logs each finished row through this: keep it whole
        with rows.open("a") as f:
            f.write(json.dumps(row.to_dict() | extra.get(row.key, {})) + "\n")
        return line(row)

    runner._line = logged
    try:
        results = runner.run_manifest(folder, server=True, numpy_max_flops=0.0, log=lambda s: print(s, flush=True))
    finally:
        runner._line = line
    results["problems"] = [r | extra.get(r["key"], {}) for r in results["problems"]]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


# -- report ----------------------------------------------------------------------------------------------
def read_rows(paths: list[Path]) -> tuple[list[dict], str]:
    """The rows of results files (``results.json``) or row logs (``rows.jsonl``), and the device they name."""
    rows, device = [], "-"
    for path in paths:
        if path.suffix == ".jsonl":
            rows += [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
        else:
            data = json.loads(path.read_text())
            rows += data["problems"]
            device = data.get("device") or device
    return rows, device


def kernel_us(row: dict, name: str) -> float | None:
    """A correct contender's kernel time a call in µs (CUPTI's; the call's wall clock where CUPTI gave none)."""
    r = row.get("contenders", {}).get(name, {})
    if r.get("status") != "ok":
        return None
    t = r.get("kernel_s") or r.get("median_s")
    return t * 1e6 if t else None


def _status(row: dict, name: str) -> str:
    t = kernel_us(row, name)
    return f"{t:.1f}" if t else str(row.get("contenders", {}).get(name, {}).get("status", "-"))


def _said(row: dict, name: str) -> str | None:
    """The runner's verdict on a contender (``ok``, ``WRONG``, ``crashed``, ``no kernel`` ...)."""
    return row.get("contenders", {}).get(name, {}).get("status")


def _dtype(row: dict) -> str:
    return row["key"].rsplit(".", 1)[-1]


def _mark(ok: bool | None) -> str:
    return "unmeasured" if ok is None else ("met" if ok else "MISSED")


def class_summary(rows: list[dict]) -> dict[str, Any]:
    """One class's figures: cuDNN/ours by type (geomean, min, count, layers below the floor), bf16/f16 time of ours
    (the worst pair), and each goal met, missed or unmeasured (None)."""
    by_type: dict[str, list[tuple[str, float]]] = {}
    times: dict[tuple[str, str], float] = {}
    for r in rows:
        ours, cud = kernel_us(r, "convbw"), kernel_us(r, "cudnn")
        if ours:
            times[(r["name"], _dtype(r))] = ours
        if ours and cud:
            by_type.setdefault(_dtype(r), []).append((r["name"], cud / ours))
    cls = rows[0].get("class", "-") if rows else "-"
    s: dict[str, Any] = {"types": {}}
    every = [v for vals in by_type.values() for _, v in vals]
    for t, vals in sorted(by_type.items()):
        vs = [v for _, v in vals]
        s["types"][t] = {"geomean": geomean(vs), "min": min(vs), "count": len(vs),
                         "below_floor": sorted(n for n, v in vals if v < GOALS["floor"])}  # fmt: skip
    # f16 time over bf16 time of ours, where both ran (> 1: f16 slower)
    pairs = [times[(n, "f16")] / times[(n, "bf16")] for (n, t) in times if t == "f16" and (n, "bf16") in times]
    s["f16_over_bf16"] = max(pairs) if pairs else None
    s["pairs"] = len(pairs)
    want = GOALS["dw_geomean"] if cls == "dw" else GOALS["geomean"]
    g = geomean(every) if every else None
    s["geomean"] = g
    s["min"] = min(every) if every else None
    s["goals"] = {f"geomean >= {want}": None if g is None else g >= want,
                  f"none < {GOALS['floor']}": None if not every else min(every) >= GOALS["floor"],
                  f"f16 within {GOALS['f16_vs_bf16'] - 1:.0%} of bf16": None if not pairs
                  else max(pairs) <= GOALS["f16_vs_bf16"]}  # fmt: skip
    s["wrong"] = sorted(r["key"] for r in rows if _said(r, "convbw") == "WRONG")
    s["cudnn_wrong"] = sorted(r["key"] for r in rows if _said(r, "cudnn") == "WRONG")  # no ratio there
    s["gemv_vs_before"] = [kernel_us(r, BEFORE) / kernel_us(r, "convbw") for r in rows
                           if kernel_us(r, BEFORE) and kernel_us(r, "convbw")]  # fmt: skip
    s["unmeasured"] = sorted(r["key"] for r in rows if not (kernel_us(r, "convbw") and kernel_us(r, "cudnn")))
    return s


def _f(v: float | None, spec: str = "{:.2f}") -> str:
    return spec.format(v) if v is not None else "-"


def report(rows: list[dict], device: str = "-", card: str = "", command: str = "") -> str:
    """The per-class table (markdown): a summary line a class against the goals, then each class's layers."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r.get("class", "-"), []).append(r)
    order = [c for c in CLASSES if c in by] + sorted(c for c in by if c not in CLASSES)
    lines = [f"# Per class: the product's untuned {TARGET} plan against cuDNN ({card or device})", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["Kernel time a call by CUPTI (µs), cuDNN in the same process; cuDNN/ours > 1: ours is faster. Goals "
              f"(issue 40): class geomean >= {GOALS['geomean']} (depthwise >= {GOALS['dw_geomean']}), none < "
              f"{GOALS['floor']}, f16 within {GOALS['f16_vs_bf16'] - 1:.0%} of bf16 (ours).", "",
              "| class | layers (f16/bf16 rows) | geomean | min | f16 geomean | bf16 geomean | below 0.5x | "
              "f16/bf16 worst | geomean goal | floor goal | f16 goal |", "|---" * 11 + "|"]  # fmt: skip
    sums = {c: class_summary(by[c]) for c in order}
    for c in order:
        s, tys = sums[c], sums[c]["types"]
        below = sorted({n for t in tys.values() for n in t["below_floor"]})
        goals = list(s["goals"].values())
        lines.append(f"| {c} | {len({r['name'] for r in by[c]})} ({len(by[c])}) | {_f(s['geomean'])} | {_f(s['min'])} "
                     f"| {_f(tys.get('f16', {}).get('geomean'))} | {_f(tys.get('bf16', {}).get('geomean'))} "
                     f"| {len(below)} | {_f(s['f16_over_bf16'], '{:.3f}')} | "
                     + " | ".join(_mark(g) for g in goals) + " |")  # fmt: skip
    for c in order:
        s = sums[c]
        gemv = any(BEFORE in r.get("contenders", {}) for r in by[c])
        head = "| layer | source | type | ours µs | plan's kernel | cuDNN µs | cuDNN/ours |"
        head += " before the GEMV rule µs | before/ours |" if gemv else ""
        lines += ["", f"## {c}", "", head, "|---" * (7 + 2 * gemv) + "|"]
        for r in by[c]:
            ours, cud = kernel_us(r, "convbw"), kernel_us(r, "cudnn")
            src = r.get("source", "-") + (" (held out)" if r.get("held_out") else "")
            kern = r.get("contenders", {}).get("convbw", {}).get("config", {}).get("kernel", "-")
            line = (f"| {r['name']} | {src} | {_dtype(r)} | {_status(r, 'convbw')} | {kern} "
                    f"| {_status(r, 'cudnn')} | {_f(cud / ours if ours and cud else None)} |")  # fmt: skip
            if gemv:
                old = kernel_us(r, BEFORE)
                has = BEFORE in r.get("contenders", {})
                line += f" {_status(r, BEFORE) if has else '-'} | {_f(old / ours if old and ours else None)} |"
            lines.append(line)
        if s["gemv_vs_before"]:
            v = s["gemv_vs_before"]
            lines += ["", f"- the GEMV kernel against the plan it replaced (before/ours): geomean {geomean(v):.2f}, "
                      f"faster on {sum(x > 1 for x in v)} of {len(v)} rows"]  # fmt: skip
        below = sorted({n for t in s["types"].values() for n in t["below_floor"]})
        lines += ["", f"- below {GOALS['floor']}x: {', '.join(below) or 'none'}"]
        if s["wrong"]:
            lines.append(f"- WRONG (ours): {', '.join(s['wrong'])}")
        if s["cudnn_wrong"]:
            lines.append(f"- cuDNN's own result WRONG (no ratio): {', '.join(s['cudnn_wrong'])}")
        if s["unmeasured"]:
            lines.append(f"- not compared (ours or cuDNN without a correct time): {len(s['unmeasured'])}")
    return "\n".join(lines) + "\n"


def _select_table(per_class: int, classes: Iterable[str] | None = None) -> str:
    """The selection, class by class (no compiler, no GPU): what a pack of ``per_class`` (``classes``: of those
    classes only) would measure, and its rows' keys in the measuring order."""
    chosen = CLASSES if classes is None else known_classes(classes)
    by = select(per_class)
    lines = [f"| class | classes suite | zoo (held out) | layers | rows ({len(TYPES)} types) |", "|---" * 5 + "|"]
    for c in chosen:
        picks = by[c]
        suite = sum(k.source == "classes" for k in picks)
        zoo = [k for k in picks if k.source == "zoo"]
        lines.append(f"| {c} | {suite} | {len(zoo)} ({sum(k.held_out for k in zoo)}) | {len(picks)} "
                     f"| {len(picks) * len(TYPES)} |")  # fmt: skip
    keys = [key for key, _, _ in entries(per_class, types=TYPES[:1], classes=chosen)]
    lines += ["", "Order (keys, f16; bf16 follows each): " + ", ".join(keys)]
    return "\n".join(lines) + "\n"


def add_run_report(sub: Any) -> None:
    """The ``run DIR --out OUT`` and ``report RESULTS... [--card] [--command]`` subcommands (this script's, and
    those of the scripts that run and report as it does)."""
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path, nargs="+", help="results.json or rows.jsonl files")
    rep.add_argument("--card", default="", help="the GPU, as nvidia-smi names it")
    rep.add_argument("--command", default="", help="the command that measured the rows")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="class_table.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select")
    s.add_argument("--per-class", type=int, default=PER_CLASS)
    each = f"only these classes' rows, keys as in the whole table ({','.join(CLASSES)}; default all)"
    s.add_argument("--classes", help=each)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--per-class", type=int, default=PER_CLASS, help=f"zoo layers a class (default {PER_CLASS})")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--timeout", type=float, default=600.0, help="seconds one compile may take")
    c.add_argument("--cache", help="the kernel cache's folder (default the user's)")
    c.add_argument("--classes", help=each)
    add_run_report(sub)
    args = ap.parse_args(argv)
    if args.cmd in ("select", "compile") and args.per_class < 0:
        ap.error(f"--per-class: expected a count >= 0, got {args.per_class}")
    classes = None
    if args.cmd in ("select", "compile") and args.classes is not None:
        try:
            classes = known_classes(args.classes.split(","))
        except ValueError as e:
            ap.error(f"--{e}")
    if args.cmd == "select":
        print(_select_table(args.per_class, classes), end="")
        return 0
    if args.cmd == "compile":
        return compile_all(args.dir, args.per_class, args.workers, args.timeout, args.cache, classes)
    if args.cmd == "run":
        return run(args.dir, args.out)
    rows, device = read_rows(args.results)
    print(report(rows, device, args.card, args.command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
