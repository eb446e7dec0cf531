"""The learned selector as plain data: gradient-boosted regression trees over the GEMM view of a problem and a
variant's choices (:func:`features`), predicting log(time / the problem's best time); :meth:`TreeSelector.choose`
takes the candidate of least predicted time. Trained by :func:`convbw_mlir.dispatch.generalize.train_selector`
(scikit-learn); loaded and evaluated here with no scikit-learn and no pickled code (docs/dispatch.md#generalize).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem

__all__ = ["FEATURES", "SELECTOR_KIND", "TreeSelector", "features", "selector_file_name"]

SELECTOR_KIND = "convbw-selector"
STRATEGIES = ("explicit", "mma", "simt", "iree")


def selector_file_name(target: str) -> str:
    """``selector.sm_80.json``: where a shipped (``convbw_mlir/tuning/``) or the user's selector lies."""
    return f"selector.{target}.json"


# -- features -------------------------------------------------------------------------------------------
FEATURES = ("log2_groups", "log2_m", "log2_n", "log2_k", "taps", "stride", "dilation", "rank", "bytes",
            "channels_last", "form_convbw", "form_iree_direct", "form_iree_torch", "form_iree_fusilli",
            *(f"strategy_{s}" for s in STRATEGIES), "log2_k_batch", "rows_split", "gemm", "log2_tile_m",
            "log2_tile_n", "log2_tile_k", "log2_streamk", "producers")  # fmt: skip


def features(problem: ConvBwdWeightProblem, variant: Variant) -> list[float]:
    """The GEMM view of ``problem`` and the choices of ``variant``, as :data:`FEATURES` lists them."""
    g, m, n, k = problem.gemm
    plan = variant.plan
    lg = lambda v: math.log2(v) if v else 0.0  # noqa: E731
    tile = plan.tile if plan is not None else None
    row = [lg(g), lg(m), lg(n), lg(k), math.prod(problem.filter_size), max(problem.stride), max(problem.dilation),
           problem.rank, DTYPES[problem.dtype], float(problem.layout_family.x[-1] == "C")]  # fmt: skip
    row += [float(variant.form == f) for f in ("convbw", "iree_direct", "iree_torch", "iree_fusilli")]
    row += [float(plan is not None and plan.strategy.value == s) for s in STRATEGIES]
    row += [lg(plan.k_batch) if plan else 0.0, float(bool(plan and plan.split and plan.split.promoted)),
            float(bool(plan and plan.gemm)), lg(tile.m if tile else 0), lg(tile.n if tile else 0),
            lg(tile.k if tile else 0), lg(plan.streamk.workgroups if plan and plan.streamk else 0),
            float(plan.wavespec.producers if plan and plan.wavespec else 0)]  # fmt: skip
    return row


# -- the learned selector ---------------------------------------------------------------------------------
@dataclass
class TreeSelector:
    """Gradient-boosted regression trees as plain data: ``init + rate * sum(tree(x))`` predicts
    log(time / the problem's best time) of a (problem, variant); :meth:`choose` takes the least."""

    target: str
    init: float
    rate: float
    trees: list[dict[str, list]]
    features: tuple[str, ...] = FEATURES
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, rows: list[list[float]]) -> list[float]:
        out = []
        for x in rows:
            total = self.init
            for t in self.trees:
                node = 0
                while t["left"][node] != -1:
                    node = t["left"][node] if x[t["feature"][node]] <= t["threshold"][node] else t["right"][node]
                total += self.rate * t["value"][node]
            out.append(total)
        return out

    def choose(self, problem: ConvBwdWeightProblem, variants: list[Variant]) -> Variant:
        """The variant of least predicted time (the first on a tie: candidates list the heuristic's first)."""
        scores = self.predict([features(problem, v) for v in variants])
        return variants[min(range(len(variants)), key=lambda i: (scores[i], i))]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": SELECTOR_KIND, "version": 1, "target": self.target, "features": list(self.features),
                "init": self.init, "rate": self.rate, "trees": self.trees, "meta": self.meta}  # fmt: skip

    def save(self, path: str | os.PathLike) -> None:
        from convbw_mlir.files import write_atomic

        write_atomic(str(path), json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> TreeSelector:
        """Raises ValueError naming the file: not a selector, or trained on other features than these."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"selector: cannot read {path}: {e}") from None
        if not isinstance(data, dict) or data.get("kind") != SELECTOR_KIND:
            raise ValueError(f"selector: {path}: not a selector (kind {SELECTOR_KIND!r})")
        if tuple(data.get("features", ())) != FEATURES:
            raise ValueError(f"selector: {path}: trained on other features than this version's")
        return cls(data["target"], float(data["init"]), float(data["rate"]), data["trees"], FEATURES, data["meta"])
