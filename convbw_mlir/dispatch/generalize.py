"""How well a selection generalizes to problems nobody tuned, and a learned selector (docs/dispatch.md#generalize).

1. :func:`split_by_model`: a fifth of a zoo's models held out, decided from the model names alone before any
   tuning (sha256 of seed and name) and written to a file (:func:`write_split`); a problem is held out when
   every model it comes from is.
2. :func:`evaluate`: on the held-out problems of timing results (:func:`convbw_mlir.dispatch.tune.time_candidates`'
   format), how often each selector's choice is within 10% of the best measured variant, and the geomean loss:
   the heuristic's plan, :func:`~convbw_mlir.dispatch.select.select` on a database of the tuned problems
   (exact, nearest or heuristic, by path) and a :class:`TreeSelector`.
3. :func:`train_selector`: gradient-boosted trees (scikit-learn's ``GradientBoostingRegressor``) on the GEMM
   view's features and the variant's, predicting a variant's time over the problem's best; a selector picks
   the candidate of least predicted time. Exported as plain JSON (the trees' splits and leaves) and
   evaluated here in numpy: loading it needs no scikit-learn and runs no pickled code.
   :func:`ships` says whether it beat nearest-neighbour and the heuristic on the held-out fifth; only then does it
   go into ``convbw_mlir/tuning/`` beside the database it was trained with.
4. :func:`cross_validate`: leave-model-out folds of the tuned models alone, scored as :func:`evaluate` scores the
   held-out ones, so that a configuration (:class:`SelectorConfig`; :data:`CHOSEN`) is chosen without them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.learned import FEATURES, TreeSelector, features
from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "CHOSEN",
    "WITHIN",
    "SelectorConfig",
    "cross_validate",
    "evaluate",
    "model_folds",
    "read_models",
    "read_split",
    "ships",
    "split_by_model",
    "train_selector",
    "write_split",
]

WITHIN = 0.10  # a choice "lands" when its time is within 10% of the best measured variant's
HELD_OUT_FRACTION = 0.2
SPLIT_KIND = "convbw-model-split"


# -- the split, decided before tuning -------------------------------------------------------------------
def split_by_model(models: list[str], fraction: float = HELD_OUT_FRACTION, seed: str = "convbw") -> dict[str, Any]:
    """Hold out ``ceil(fraction * len(models))`` models: those first in sha256(seed, name) order.

    Decided by the names alone, so it is fixed before any problem is built or measured and anyone can
    recompute it. Raises ValueError on no models or a fraction outside (0, 1).
    """
    names = sorted(set(models))
    if not names:
        raise ValueError("models: expected at least one model name, got none")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction: expected a number between 0 and 1, got {fraction!r}")
    order = sorted(names, key=lambda m: hashlib.sha256(f"{seed}\0{m}".encode()).hexdigest())
    held = sorted(order[: math.ceil(fraction * len(names))])
    return {"kind": SPLIT_KIND, "version": 1, "seed": seed, "fraction": fraction, "held_out": held,
            "tuned": sorted(set(names) - set(held))}  # fmt: skip


def write_split(path: str | os.PathLike, split: dict[str, Any]) -> None:
    """Write the split (before tuning: the held-out models are on record before any time is)."""
    from convbw_mlir.files import write_atomic

    write_atomic(str(path), json.dumps(split, indent=1) + "\n")


def read_split(path: str | os.PathLike) -> dict[str, Any]:
    """The split written by :func:`write_split`. Raises ValueError naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"split: cannot read {path}: {e}") from None
    if not isinstance(data, dict) or data.get("kind") != SPLIT_KIND:
        raise ValueError(f"split: {path}: not a model split (kind {SPLIT_KIND!r})")
    for name in ("held_out", "tuned"):
        if not isinstance(data.get(name), list) or not all(isinstance(m, str) for m in data[name]):
            raise ValueError(f"split: {path}: {name}: expected a list of model names")
    return data


def is_held_out(models: list[str], split: dict[str, Any]) -> bool:
    """A problem is held out when every model it comes from is (a layer shared with a tuned model is tuned)."""
    held = set(split["held_out"])
    return bool(models) and all(m in held for m in models)


# -- timing results ---------------------------------------------------------------------------------------
def _times(row: dict[str, Any]) -> dict[str, float]:
    """Correct, timed contenders of a results row: name -> seconds (kernel time where all have it); cuDNN, timed
    beside them, is none of them."""
    ok = {n: r for n, r in row["contenders"].items() if n != "cudnn" and r.get("status") == "ok" and "median_s" in r}
    metric = "kernel_s" if ok and all("kernel_s" in r for r in ok.values()) else "median_s"
    return {n: r[metric] for n, r in ok.items()}


def _variants(row: dict[str, Any]) -> dict[str, Variant]:
    return {n: Variant.from_dict(v) for n, v in row.get("variants", {}).items()}


def training_rows(results: dict[str, Any], split: dict[str, Any] | None = None,
                  models: dict[str, list[str]] | None = None,
                  cap: float | None = None) -> tuple[list, list]:  # fmt: skip
    """(features, log(time / best)) of every correct, timed variant of the tuned problems; with ``cap``, a
    variant more than ``cap`` times the best counts as ``cap`` times (how far a loser loses is not learned)."""
    top = math.log(cap) if cap else math.inf
    xs, ys = [], []
    for row in results["problems"]:
        if _held(row, split, models):
            continue
        times, variants = _times(row), _variants(row)
        timed = {n: t for n, t in times.items() if n in variants}
        if not timed:
            continue
        best = min(timed.values())
        problem = ConvBwdWeightProblem.from_dict(row["problem"])
        for name, t in timed.items():
            xs.append(features(problem, variants[name], results["target"]))
            ys.append(min(math.log(t / best), top))
    return xs, ys


@dataclass(frozen=True)
class SelectorConfig:
    """How :func:`train_selector` fits: ``trees`` of ``depth`` at learning ``rate``, at least ``leaf`` rows a leaf,
    the target capped at ``cap`` times the best (:func:`training_rows`; None: uncapped)."""

    trees: int = 200
    depth: int = 3
    rate: float = 0.05
    leaf: int = 1
    cap: float | None = None

    def __post_init__(self) -> None:
        for name in ("trees", "depth", "leaf"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"selector config: {name}: expected a whole number >= 1, got {getattr(self, name)!r}")
        if not 0 < self.rate <= 1:
            raise ValueError(f"selector config: rate: expected a number in (0, 1], got {self.rate!r}")
        if self.cap is not None and not self.cap > 1:
            raise ValueError(f"selector config: cap: expected a number > 1 (times the best) or none, got {self.cap!r}")


# Chosen by leave-model-out cross-validation on the tuned models alone (cross_validate, three draws of the folds;
# every configuration tried: bench/results/cpu_2026-12-06_selector_cv/cv.md): the cap keeps the squared loss from
# spending its trees on how far IREE's slow forms lose; depth 6 lets a split's worth hang on waves, slice length and
# kernel together (depth 7 scored 1.3 problems a draw more: within the draws' spread, at twice the nodes).
CHOSEN = SelectorConfig(trees=200, depth=6, cap=2.0)


def train_selector(results: dict[str, Any], split: dict[str, Any] | None = None,
                   models: dict[str, list[str]] | None = None, config: SelectorConfig = CHOSEN,
                   seed: int = 0) -> TreeSelector:  # fmt: skip
    """Fit gradient-boosted trees (scikit-learn) as ``config`` says on the tuned problems of ``results``.

    Raises:
        ValueError: no tuned problem with a timed variant. ImportError: scikit-learn is not installed.
    """
    from sklearn.ensemble import GradientBoostingRegressor

    xs, ys = training_rows(results, split, models, config.cap)
    if not xs:
        raise ValueError("results: no tuned problem with a correct, timed variant to learn from")
    model = GradientBoostingRegressor(n_estimators=config.trees, max_depth=config.depth, learning_rate=config.rate,
                                      min_samples_leaf=config.leaf, random_state=seed)  # fmt: skip
    model.fit(xs, ys)
    exported = []
    for (est,) in model.estimators_:
        t = est.tree_
        exported.append({"left": t.children_left.tolist(), "right": t.children_right.tolist(),
                         "feature": t.feature.tolist(), "threshold": t.threshold.tolist(),
                         "value": t.value[:, 0, 0].tolist()})  # fmt: skip
    init = float(model.init_.constant_.ravel()[0])
    meta = {"problems": len({json.dumps(r["problem"]) for r in results["problems"] if not _held(r, split, models)}),
            "rows": len(xs), "device": results.get("device"), "iree_version": results.get("iree_version"),
            "config": asdict(config)}  # fmt: skip
    return TreeSelector(results["target"], init, config.rate, exported, FEATURES, meta)


def _held(row: dict[str, Any], split: dict[str, Any] | None, models: dict[str, list[str]] | None = None) -> bool:
    """Held out by the split where one is given (the row's models: ``models[name]`` or its own ``models``),
    else by the run's own flag."""
    if split is None:
        return bool(row.get("held_out"))
    return is_held_out((models or {}).get(row.get("name"), row.get("models", [])), split)


# -- the evaluation ---------------------------------------------------------------------------------------
def evaluate(results: dict[str, Any], split: dict[str, Any] | None = None, selector: TreeSelector | None = None,
             models: dict[str, list[str]] | None = None) -> dict[str, Any]:  # fmt: skip
    """For the held-out problems of ``results``: each selector's choice against the best measured variant.

    ``results`` should time every candidate of every problem (``convbw tune --no-hold-out``): the split,
    not the run, says which problems are held out (``models`` maps a row's name to its models), and the
    database ``select`` consults holds the tuned problems only.

    Selectors: ``heuristic`` (the plan's own when the run was tuned), ``plan now`` (the plan's own today),
    ``select`` (exact, nearest or heuristic on a database of the
    tuned problems; also broken down by path), ``nearest`` (``select``'s choice where a tuned problem is near,
    else the heuristic's), ``learned`` (``selector``, where given, among the timed candidates), ``product`` (what
    ``select`` gives a user untuned today: the installed learned selector among today's candidates, where one is
    installed for the target). Each gets ``within`` (choices within
    :data:`WITHIN` of the best), ``measured`` (choices that were timed), ``geomean_loss`` (geomean of
    time / best, minus 1) and ``not_measured`` (a choice no candidate of the run was: left out of the rates).
    """
    from convbw_mlir.dispatch.select import select
    from convbw_mlir.dispatch.tune import build_database

    tuned = dict(results, problems=[dict(r, held_out=_held(r, split, models)) for r in results["problems"]])
    db = build_database(tuned, device=results.get("device") or "device")
    per: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    rows = []
    for row in tuned["problems"]:
        if not row["held_out"]:
            continue
        times, variants = _times(row), _variants(row)
        if not times:
            continue
        best = min(times.values())
        problem = ConvBwdWeightProblem.from_dict(row["problem"])
        sel = select(problem, results["target"], dbs=[db], selector=False)  # the paths without a learned one
        choices = {"heuristic": row.get("heuristic"), "select": _name_of(sel.variant, variants),
                   f"select:{sel.path}": _name_of(sel.variant, variants)}  # fmt: skip
        choices["nearest"] = choices["select"] if sel.path != "heuristic" else row.get("heuristic")
        # what a user gets untuned today: select with the installed learned selector, among today's candidates
        choices["product"] = _name_of(select(problem, results["target"], dbs=[db]).variant, variants)
        # the plan's rules as they are now (the run recorded the heuristic of its day): not measured where they moved
        choices["plan now"] = _name_of(Variant("convbw", decide(problem, results["target"])), variants)
        if selector is not None:
            timed = [n for n in times if n in variants]
            choices["learned"] = _name_of(selector.choose(problem, [variants[n] for n in timed]), variants)
        entry = {"name": row.get("name"), "best": min(times, key=times.get), "path": sel.path}
        for who, name in choices.items():
            if name is None or name not in times:
                missing[who] = missing.get(who, 0) + 1
                continue
            per.setdefault(who, []).append(times[name] / best)
            entry[who] = name
        rows.append(entry)
    return {"held_out_problems": len(rows), "selectors": _summary(per, missing), "rows": rows}


def _summary(per: dict[str, list[float]], missing: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each selector's choices within :data:`WITHIN` of the best, their count and geomean loss (time / best)."""
    return {who: {"within": sum(r <= 1 + WITHIN for r in ratios), "measured": len(ratios),
                  "within_rate": sum(r <= 1 + WITHIN for r in ratios) / len(ratios),
                  "geomean_loss": statistics.geometric_mean(ratios) - 1, "not_measured": missing.get(who, 0)}
            for who, ratios in per.items() if ratios}  # fmt: skip


def _name_of(variant: Variant, variants: dict[str, Variant]) -> str | None:
    return next((n for n, v in variants.items() if v == variant), None)


# -- leave-model-out cross-validation over the tuned models --------------------------------------------------
CV_FOLDS = 5


def model_folds(split: dict[str, Any], folds: int = CV_FOLDS, seed: str = "convbw-cv") -> list[list[str]]:
    """The split's tuned models dealt into ``folds`` folds in sha256(seed, name) order (by the names alone, like
    the split). Raises ValueError when ``folds`` is under 2 or over the tuned models."""
    tuned = sorted(split["tuned"])
    if not 2 <= folds <= len(tuned):
        raise ValueError(f"folds: expected 2 to {len(tuned)} (the split's tuned models), got {folds!r}")
    order = sorted(tuned, key=lambda m: hashlib.sha256(f"{seed}\0{m}".encode()).hexdigest())
    return [sorted(order[f::folds]) for f in range(folds)]


Trainer = Callable[[dict[str, Any], dict[str, Any], dict[str, list[str]] | None], Any]


def cross_validate(results: dict[str, Any], split: dict[str, Any], models: dict[str, list[str]] | None = None,
                   folds: int = CV_FOLDS, config: SelectorConfig = CHOSEN, train: Trainer | None = None,
                   fold_seed: str = "convbw-cv") -> dict[str, Any]:  # fmt: skip
    """Leave-model-out cross-validation on the split's TUNED models only: the held-out models' rows are dropped
    before anything is fitted or scored. Each fold's models play the held-out part: a selector is trained on the
    rest's rows alone (``train(results, fold_split, models)``, default :func:`train_selector` with ``config``),
    scored as :func:`evaluate` scores the held-out problems (its choice among the timed variants within
    :data:`WITHIN` of the best; the geomean loss). A problem is scored in the fold where every model it comes from
    is that fold's or held out (a layer models of two folds share only trains); ``heuristic`` (the run's plan) is
    scored beside. ``fold_seed`` deals the folds (:func:`model_folds`): another seed, another draw of the models.

    Returns ``{"folds", "problems", "selectors": {"learned", "heuristic"}, "per_fold", "rows"}``.
    """
    train = train or (lambda r, s, m: train_selector(r, s, m, config))
    tuned = dict(results, problems=[r for r in results["problems"] if not _held(r, split, models)])
    per: dict[str, list[float]] = {"learned": [], "heuristic": []}
    missing: dict[str, int] = {}
    per_fold, rows = [], []
    for f, fold in enumerate(model_folds(split, folds, fold_seed)):
        fold_split = {"held_out": sorted({*split["held_out"], *fold}), "tuned": sorted(set(split["tuned"]) - set(fold))}
        scored = [r for r in tuned["problems"] if _held(r, fold_split, models)]
        selector = train(dict(tuned, problems=[r for r in tuned["problems"] if r not in scored]), fold_split, models)
        ratios = []
        for row in scored:
            times, variants = _times(row), _variants(row)
            timed = [n for n in times if n in variants]
            if not timed:
                continue
            best = min(times.values())
            problem = ConvBwdWeightProblem.from_dict(row["problem"])
            chosen = _name_of(selector.choose(problem, [variants[n] for n in timed]), variants)
            entry = {"name": row.get("name"), "fold": f, "best": min(times, key=times.get), "learned": chosen}
            for who, name in (("learned", chosen), ("heuristic", row.get("heuristic"))):
                if name in times:
                    per[who].append(times[name] / best)
                else:
                    missing[who] = missing.get(who, 0) + 1
            ratios.append(times[chosen] / best)
            rows.append(entry)
        per_fold.append({"models": fold, "problems": len(ratios), "within": sum(r <= 1 + WITHIN for r in ratios)})
    return {"folds": folds, "problems": len(rows), "selectors": _summary(per, missing), "per_fold": per_fold,
            "rows": rows}  # fmt: skip


def ships(report: dict[str, Any]) -> bool:
    """Whether the learned selector beat both nearest-neighbour and the heuristic on the held-out problems: more
    choices within 10% of the best than each, or as many with a smaller geomean loss (issue 39: a selector that
    loses to the plan's own rule on unseen models must not replace it)."""
    s = report["selectors"]
    if not {"learned", "nearest", "heuristic"} <= s.keys():
        return False
    a = s["learned"]
    return all((a["within_rate"], -a["geomean_loss"]) > (b["within_rate"], -b["geomean_loss"])
               for b in (s["nearest"], s["heuristic"]))  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The report as a table: selector, within 10%, geomean loss, choices not measured."""
    lines = [f"{report['held_out_problems']} held-out problems", "",
             "| selector | within 10% of the best | geomean loss | not measured |", "|---|---:|---:|---:|"]  # fmt: skip
    for who, s in sorted(report["selectors"].items()):
        lines.append(f"| {who} | {s['within']} of {s['measured']} ({s['within_rate']:.0%}) "
                     f"| {s['geomean_loss']:.1%} | {s['not_measured']} |")  # fmt: skip
    verdict = "ships" if ships(report) else "does not ship"
    lines += ["", f"learned selector: {verdict} (it must beat nearest-neighbour and the heuristic on the held-out "
              "problems)"]  # fmt: skip
    return "\n".join(lines) + "\n"


def read_models(source: str) -> dict[str, list[str]]:
    """Problem name -> its models: a JSON file of that map, or a suite whose comments name them (``zoo``:
    :func:`convbw_mlir.suites.suite_models`). Raises ValueError naming ``source`` where it is neither."""
    from convbw_mlir.suites import suite_models

    if source.endswith(".json"):
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"models: cannot read {source}: {e}") from None
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise ValueError(f"models: {source}: expected an object of problem name -> [model names]")
        return data
    try:
        return suite_models(source)
    except FileNotFoundError as e:
        raise ValueError(f"models: {e}") from None


def cv_markdown(cv: dict[str, Any], config: SelectorConfig) -> str:
    """The cross-validation as a table: the learned selector (``config``) and the run's heuristic, then each fold."""
    lines = [f"Leave-model-out cross-validation, {cv['folds']} folds of the tuned models, {cv['problems']} problems "
             f"scored; config: {asdict(config)}", "",
             "| selector | within 10% of the best | geomean loss | not measured |", "|---|---:|---:|---:|"]  # fmt: skip
    for who, s in sorted(cv["selectors"].items()):
        lines.append(f"| {who} | {s['within']} of {s['measured']} ({s['within_rate']:.1%}) "
                     f"| {s['geomean_loss']:.1%} | {s['not_measured']} |")  # fmt: skip
    lines += ["", "| fold | models | problems | learned within 10% |", "|---:|---|---:|---:|"]
    for i, f in enumerate(cv["per_fold"]):
        lines.append(f"| {i} | {', '.join(f['models'])} | {f['problems']} | {f['within']} |")
    return "\n".join(lines) + "\n"


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Timing results (``results.json``, or ``xz``-compressed as committed: ``results.json.xz``)."""
    if str(path).endswith(".xz"):
        import lzma

        return json.loads(lzma.decompress(Path(path).read_bytes()))
    return json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    """``python -m convbw_mlir.dispatch.generalize {split,evaluate,cv}``: the split before tuning, the report after,
    the cross-validation on the tuned models that chooses a selector's configuration without the held-out ones."""
    import argparse
    import lzma
    import sys

    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.dispatch.generalize", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="hold out a fifth of the models; write the split")
    sp.add_argument("--models", required=True, help="a JSON file (problem name -> [model names]) or a suite (zoo)")
    sp.add_argument("--fraction", type=float, default=HELD_OUT_FRACTION)
    sp.add_argument("--out", required=True)
    ev = sub.add_parser("evaluate", help="the held-out report of timing results; train the learned selector")
    cv = sub.add_parser("cv", help="leave-model-out cross-validation of a selector config on the tuned models only")
    for p in (ev, cv):
        p.add_argument("results", help="timing results (results.json, or .json.xz)")
        p.add_argument("--split", required=True)
        p.add_argument("--models", required=True, help="a JSON file (problem name -> [model names]) or a suite (zoo)")
        p.add_argument("--out", required=True, help="the report (markdown; .json beside it)")
    ev.add_argument("--selector-out", help="where the learned selector is written if it ships")
    cv.add_argument("--folds", type=int, default=CV_FOLDS, help=f"folds of the tuned models (default {CV_FOLDS})")
    for name, kind in (("trees", int), ("depth", int), ("rate", float), ("leaf", int), ("cap", float)):
        cv.add_argument(f"--{name}", type=kind, default=getattr(CHOSEN, name), help=f"default {getattr(CHOSEN, name)}")
    args = ap.parse_args(argv)
    try:
        models = read_models(args.models)
        if args.cmd == "split":
            write_split(args.out, split_by_model([m for ms in models.values() for m in ms], args.fraction))
            return 0
        results = read_results(args.results)
        split = read_split(args.split)
        if args.cmd == "cv":
            config = SelectorConfig(args.trees, args.depth, args.rate, args.leaf, args.cap)
            report = cross_validate(results, split, models, args.folds, config)
            text = cv_markdown(report, config)
        else:
            selector = train_selector(results, split, models)
            report = evaluate(results, split, selector, models)
            text = markdown(report)
    except (OSError, ValueError, KeyError, lzma.LZMAError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    if args.cmd == "evaluate" and args.selector_out and ships(report):
        selector.save(args.selector_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
