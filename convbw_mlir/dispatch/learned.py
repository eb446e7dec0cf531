"""The learned selector as plain data: gradient-boosted regression trees over the GEMM view of a problem, a
variant's choices and what they make of the target (waves of workgroups over its SMs, k steps a split, bytes a flop:
:func:`features`), predicting log(time / the problem's best time), capped; :meth:`TreeSelector.choose`
takes the candidate of least predicted time. Trained by :func:`convbw_mlir.dispatch.generalize.train_selector`
(scikit-learn); loaded and evaluated here with no scikit-learn and no pickled code (docs/dispatch.md#generalize).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.variants import Variant
from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem
from convbw_mlir.targets import get_target

__all__ = ["FEATURES", "SELECTOR_KIND", "SELECTOR_VERSION", "TreeSelector", "features", "selector_file_name"]

SELECTOR_KIND = "convbw-selector"
SELECTOR_VERSION = 2  # 2: the derived features (waves, last wave's fill, k steps, bytes a flop...); 1's are ignored
STRATEGIES = ("explicit", "mma", "simt", "iree")


def selector_file_name(target: str) -> str:
    """``selector.sm_80.json``: where a shipped (``convbw_mlir/tuning/``) or the user's selector lies."""
    return f"selector.{target}.json"


# -- features -------------------------------------------------------------------------------------------
BASE_FEATURES = ("log2_groups", "log2_m", "log2_n", "log2_k", "taps", "stride", "dilation", "rank", "bytes",
                 "channels_last", "form_convbw", "form_iree_direct", "form_iree_torch", "form_iree_fusilli",
                 *(f"strategy_{s}" for s in STRATEGIES), "log2_k_batch", "rows_split", "gemm", "log2_tile_m",
                 "log2_tile_n", "log2_tile_k", "log2_streamk", "producers")  # fmt: skip
# Derived from the GEMM view, the tile and the target's SM count, so that what the trees learn of one shape carries
# to shapes of other sizes (docs/dispatch.md#generalize): how many waves of workgroups fill the GPU and how full the
# last is, the k steps each split walks, the bytes a flop moves (split partials included), the tiles' padding.
DERIVED_FEATURES = ("log2_waves", "last_wave_fill", "log2_k_steps", "log2_slice", "log2_bytes_per_flop",
                    "log2_intensity", "tile_fill", "channels_odd")  # fmt: skip
FEATURES = (*BASE_FEATURES, *DERIVED_FEATURES)


def _lg(v: float) -> float:
    return math.log2(v) if v > 0 else 0.0


def features(problem: ConvBwdWeightProblem, variant: Variant, target: str | None = None) -> list[float]:
    """The GEMM view of ``problem`` and the choices of ``variant``, as :data:`FEATURES` lists them; the SM count
    is ``target``'s (default the plan's; an IREE form's variant has no plan, no tile, and zeros there)."""
    g, m, n, k = problem.gemm
    plan = variant.plan
    tile = plan.tile if plan is not None else None
    k_batch = plan.k_batch if plan is not None else 1
    row = [_lg(g), _lg(m), _lg(n), _lg(k), math.prod(problem.filter_size), max(problem.stride), max(problem.dilation),
           problem.rank, DTYPES[problem.dtype], float(problem.layout_family.x[-1] == "C")]  # fmt: skip
    row += [float(variant.form == f) for f in ("convbw", "iree_direct", "iree_torch", "iree_fusilli")]
    row += [float(plan is not None and plan.strategy.value == s) for s in STRATEGIES]
    row += [_lg(k_batch) if plan else 0.0, float(bool(plan and plan.split and plan.split.promoted)),
            float(bool(plan and plan.gemm)), _lg(tile.m if tile else 0), _lg(tile.n if tile else 0),
            _lg(tile.k if tile else 0), _lg(plan.streamk.workgroups if plan and plan.streamk else 0),
            float(plan.wavespec.producers if plan and plan.wavespec else 0)]  # fmt: skip
    # split partials: k_batch f32 copies of dW written and read back by the second stage
    moved = problem.min_bytes + (2 * k_batch * g * m * n * 4 if k_batch > 1 else 0)
    waves = fill = steps = tile_fill = 0.0
    if tile is not None:
        sms = get_target(target or plan.target).compute_units
        taps = math.prod(problem.filter_size)
        tiles_m, tiles_n = math.ceil(problem.out_channels / tile.m), math.ceil(problem.in_channels / tile.n)
        workgroups = plan.streamk.workgroups if plan.streamk else g * tiles_m * tiles_n * taps * k_batch
        waves = workgroups / sms
        fill = (workgroups % sms or sms) / sms  # a partly filled last wave leaves SMs idle
        steps = k / (k_batch * tile.k)
        tile_fill = problem.out_channels * problem.in_channels / (tiles_m * tile.m * tiles_n * tile.n)
    row += [_lg(waves), fill, _lg(steps), _lg(k / k_batch), _lg(moved / problem.flops),
            _lg(problem.flops / problem.min_bytes), tile_fill,
            float(bool(problem.in_channels % 16 or problem.out_channels % 16))]  # fmt: skip
    return row


def instruction_family(variant: Variant) -> str | None:
    """The family of a variant's matrix instruction (``NV_WGMMA``, ``NV_MMA_SYNC``, ``MFMA``, ``WMMA``), None where
    its plan has no matrix-core tile (IREE's forms, codegen, simt)."""
    tile = variant.plan.tile if variant.plan is not None else None
    if tile is None:
        return None
    return re.split(r"_(?:F|I|BF)\d", tile.intrinsic, maxsplit=1)[0]


def same_instruction(problem: ConvBwdWeightProblem, variants: list[Variant], target: str) -> list[Variant]:
    """``variants`` less those on another matrix instruction than the plan's (wgmma <-> mma.sync): the trees barely
    saw such a switch, and where they made one on held-back layers it lost (docs/dispatch.md#generalize). All of
    them where none is left or the plan has no tile."""
    from convbw_mlir.plan import decide

    try:
        own = instruction_family(Variant("convbw", decide(problem, target)))
    except ValueError:  # no plan of ours (a PlanError): nothing to keep to
        return variants
    kept = [v for v in variants if instruction_family(v) in (None, own)]
    return kept if own is not None and kept else variants


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
        """The variant of least predicted time (the first on a tie: candidates list the heuristic's first) among
        those that keep the plan's matrix instruction (:func:`same_instruction`)."""
        variants = same_instruction(problem, variants, self.target)
        scores = self.predict([features(problem, v, self.target) for v in variants])
        return variants[min(range(len(variants)), key=lambda i: (scores[i], i))]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": SELECTOR_KIND, "version": SELECTOR_VERSION, "target": self.target,
                "features": list(self.features), "init": self.init, "rate": self.rate, "trees": self.trees,
                "meta": self.meta}  # fmt: skip

    def save(self, path: str | os.PathLike) -> None:
        from convbw_mlir.files import write_atomic

        write_atomic(str(path), json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> TreeSelector:
        """Raises ValueError naming the file: not a selector, of another version, or trained on other features than
        these (``select`` then ignores it with a warning)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"selector: cannot read {path}: {e}") from None
        if not isinstance(data, dict) or data.get("kind") != SELECTOR_KIND:
            raise ValueError(f"selector: {path}: not a selector (kind {SELECTOR_KIND!r})")
        if data.get("version") != SELECTOR_VERSION:
            found = data.get("version")
            raise ValueError(f"selector: {path}: version {found!r}, this version reads {SELECTOR_VERSION}")
        if tuple(data.get("features", ())) != FEATURES:
            raise ValueError(f"selector: {path}: trained on other features than this version's")
        return cls(data["target"], float(data["init"]), float(data["rate"]), data["trees"], FEATURES, data["meta"])
