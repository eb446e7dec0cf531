"""Every selector configuration tried for issue 39 goal 1, scored by leave-model-out cross-validation over the tuned
models only (generalize.cross_validate: 5 folds of the 35 tuned models; no held-out row read). Prints the table of
cv.md. Run from the repository root: .venv/bin/python bench/results/cpu_2026-12-06_selector_cv/sweep.py RESULTS
(RESULTS: bench/results/h100_2026-12-06_zootune2/results.json.xz decompressed) [NAMES separated by ; FOLD_SEED]."""

from __future__ import annotations

import json
import sys

from convbw_mlir.dispatch import generalize as gz
from convbw_mlir.dispatch.learned import BASE_FEATURES, FEATURES, features

BASE = [FEATURES.index(f) for f in BASE_FEATURES]
ALL = list(range(len(FEATURES)))


class Columns:
    """A gradient-boosted selector on a subset of FEATURES (scikit-learn's own predict: = TreeSelector's)."""

    def __init__(
        self,
        results,
        split,
        models,
        cols,
        *,
        trees=200,
        depth=3,
        rate=0.05,
        leaf=1,
        cap=None,
        seed=0,
        subsample=1.0,
        loss="squared_error",
        target="best",
    ):
        from sklearn.ensemble import GradientBoostingRegressor

        self.cols, self.target = cols, results["target"]
        xs, ys = gz.training_rows(results, split, models, cap)
        if target == "within":  # a classifier's target as a regression: 1 if within 10% of the best, else 0
            ys = [0.0 if y <= 0.0953 else 1.0 for y in ys]  # log(1.1) = 0.0953
        self.model = GradientBoostingRegressor(
            n_estimators=trees,
            max_depth=depth,
            learning_rate=rate,
            min_samples_leaf=leaf,
            random_state=seed,
            subsample=subsample,
            loss=loss,
        ).fit([[x[c] for c in cols] for x in xs], ys)

    def choose(self, problem, variants):
        scores = self.model.predict(
            [[f[c] for c in self.cols] for f in (features(problem, v, self.target) for v in variants)]
        )
        return variants[min(range(len(variants)), key=lambda i: (scores[i], i))]


class Ensemble:
    def __init__(self, parts):
        self.parts = parts

    def choose(self, problem, variants):
        import numpy as np

        xs = [features(problem, v, self.parts[0].target) for v in variants]
        scores = np.mean([p.model.predict([[f[c] for c in p.cols] for f in xs]) for p in self.parts], axis=0)
        return variants[min(range(len(variants)), key=lambda i: (scores[i], i))]


def configs():
    derived = {f: FEATURES.index(f) for f in FEATURES if f not in BASE_FEATURES}
    yield "old features, 200 trees depth 3 (the shipped config)", BASE, {}
    yield "+ all derived features", ALL, {}
    for name, i in derived.items():
        yield f"+ {name} only", BASE + [i], {}
    for kw in (
        {"depth": 2},
        {"depth": 4},
        {"depth": 5},
        {"trees": 100},
        {"trees": 400},
        {"leaf": 5},
        {"leaf": 20},
        {"cap": 1.5},
        {"cap": 2.0},
        {"cap": 1.25},
        {"subsample": 0.7},
        {"loss": "huber"},
        {"target": "within"},
        {"depth": 4, "leaf": 10},
        {"trees": 400, "rate": 0.025},
    ):
        yield "all derived, " + ", ".join(f"{k} {v}" for k, v in kw.items()), ALL, kw
    # round 2: the cap of 2 (round 1's best) with the capacities round 1 liked
    yield "old features, cap 2.0", BASE, {"cap": 2.0}
    for kw in (
        {"cap": 3.0},
        {"cap": 2.0, "depth": 4},
        {"cap": 2.0, "depth": 5},
        {"cap": 2.0, "trees": 400},
        {"cap": 2.0, "leaf": 5},
        {"cap": 2.0, "loss": "huber"},
        {"cap": 2.0, "depth": 4, "leaf": 5},
        {"cap": 2.0, "depth": 4, "trees": 400},
        {"cap": 2.0, "subsample": 0.7},
    ):
        yield "all derived, " + ", ".join(f"{k} {v}" for k, v in kw.items()), ALL, kw
    # round 3: around depth 5 (round 2's best on three draws of the folds)
    for kw in (
        {"cap": 2.0, "depth": 6},
        {"cap": 2.0, "depth": 5, "leaf": 5},
        {"cap": 1.5, "depth": 5},
        {"cap": 3.0, "depth": 5},
        {"cap": 2.0, "depth": 5, "trees": 100},
        {"cap": 2.0, "depth": 7},
        {"cap": 2.0, "depth": 8},
        {"cap": 2.0, "depth": 6, "leaf": 3},
    ):
        yield "all derived, " + ", ".join(f"{k} {v}" for k, v in kw.items()), ALL, kw


def main(path: str, only: str = "", fold_seed: str = "convbw-cv") -> None:
    results = json.load(open(path))
    split = gz.read_split("bench/zoo_split.json")
    models = gz.read_models("zoo")
    print("| configuration | CV within 10% | CV geomean loss |\n|---|---:|---:|", flush=True)
    for name, cols, kw in configs():
        if only and name not in only.split(";"):
            continue
        cv = gz.cross_validate(
            results,
            split,
            models,
            fold_seed=fold_seed,
            train=lambda r, s, m, cols=cols, kw=kw: Columns(r, s, m, cols, **kw),
        )
        s = cv["selectors"]["learned"]
        print(
            f"| {name} | {s['within']} of {s['measured']} ({s['within_rate']:.1%}) | {s['geomean_loss']:.1%} |",
            flush=True,
        )
    h = cv["selectors"]["heuristic"]
    print(
        f"| (the run's heuristic) | {h['within']} of {h['measured']} ({h['within_rate']:.1%}) "
        f"| {h['geomean_loss']:.1%} |"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
