"""Select: which variant computes a problem on a target, and why.

:func:`select` tries, in order:

1. ``exact``: a tuning database entry for exactly this problem (measured and verified on a device);
2. ``nearest``: the winner of the nearest tuned problem on the GEMM view (distance below), re-decided
   for this problem with the same overrides, where :func:`convbw_mlir.plan.decide` accepts them. Only our
   own pipeline's variants transfer: IREE's default forms were wrong on some problems (every 1x1 on
   sm_80), so they are used only where they were verified, on an exact hit;
3. ``heuristic``: :func:`convbw_mlir.plan.decide`'s own plan.

Distance between problems of one element type, rank and layout family: the sum of |log2| ratios of the
GEMM view's M, N, K and groups, plus 2 where the filter differs and 1 where the strides differ. Beyond
:data:`NEAREST_MAX` (a factor 2 in one size) no neighbour is near enough.

Databases: the ones shipped in the package (``convbw_mlir/tuning/*.json``) and the user's
(``<cache>/tuning/*.json``, where ``convbw tune --import`` puts them), for the target; with ``device``,
only that device's.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.db import DatabaseError, TuningDB, db_file_name, problem_key
from convbw_mlir.dispatch.variants import Variant, dist_version, heuristic
from convbw_mlir.plan import PlanError, check_plan, decide
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = ["NEAREST_MAX", "Selection", "databases", "distance", "select"]

# A neighbour farther than this says nothing: the heuristic decides. Measured on the H100 (docs/dispatch.md#untuned):
# the overrides of neighbours at distance 2-4 lost 13-39% against the heuristic's own plan on held-out problems.
NEAREST_MAX = 1.0
SHIPPED: Any = files("convbw_mlir") / "tuning"


@dataclass(frozen=True)
class Selection:
    """The chosen variant, the path that chose it (``exact``, ``nearest``, ``heuristic``) and why."""

    variant: Variant
    path: str
    why: str
    entry: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.variant.name} ({self.path}: {self.why})"


def _version() -> str:
    """IREE's version: the compiler's, else (a runtime-only install) the runtime's."""
    return dist_version("iree-base-compiler") or dist_version("iree-base-runtime") or "none"


_LOADED: dict[tuple[str, float], TuningDB | None] = {}


def _load(path: Path, iree: str) -> TuningDB | None:
    try:
        stamp = (str(path), path.stat().st_mtime)
    except OSError:
        return None
    if stamp not in _LOADED:
        try:
            _LOADED[stamp] = TuningDB.load(path, iree)
        except DatabaseError as e:
            warnings.warn(f"{e}: ignored", stacklevel=3)
            _LOADED[stamp] = None
    return _LOADED[stamp]


def databases(target: str, device: str | None = None, extra: list[str | os.PathLike] | None = None) -> list[TuningDB]:
    """The usable databases for ``target`` (and ``device``): shipped, the user's, then ``extra``.

    A malformed file found in a database folder is ignored with a warning, a bad entry left out with one.

    Raises:
        ValueError: a file of ``extra`` that cannot be read or is not a database (naming it).
    """
    for p in extra or []:  # asked for by name: an error, not a warning
        try:
            TuningDB.load(p)
        except OSError as e:
            raise ValueError(f"--db: cannot read {p}: {e.strerror or e}") from None
        except DatabaseError as e:
            raise ValueError(f"--db: {e}") from None
    from convbw_mlir.dispatch.cache import default_cache_dir

    iree = _version()
    folders: list[Any] = [SHIPPED, default_cache_dir() / "tuning"]
    paths: list[Path] = []
    suffix = f".{target}.json"
    for folder in folders:
        names = [n for n in _listing(folder) if n.endswith(suffix)]
        if device is not None:
            names = [n for n in names if n == db_file_name(device, target)]
        paths += [Path(str(folder / n)) for n in names]
    paths += [Path(p) for p in extra or []]
    out = []
    for p in paths:
        db = _load(p, iree)
        if db is not None and db.target == target:
            out.append(db)
    return out


_LISTINGS: dict[tuple[str, float], list[str]] = {}


def _listing(folder: Any) -> list[str]:
    """The sorted file names of ``folder`` (none if absent), re-read only when its mtime changes."""
    try:
        stamp = (str(folder), os.stat(str(folder)).st_mtime)
    except OSError:
        return []
    if stamp not in _LISTINGS:
        try:
            _LISTINGS[stamp] = sorted(f.name for f in folder.iterdir())
        except OSError:
            return []
    return _LISTINGS[stamp]


def _features(p: ConvBwdWeightProblem) -> tuple[float, ...]:
    g, m, n, k = p.gemm
    return (math.log2(m), math.log2(n), math.log2(k), math.log2(g))


def distance(a: ConvBwdWeightProblem, b: ConvBwdWeightProblem) -> float:
    """Distance on the GEMM view (see the module docstring); ``inf`` across types, ranks or layouts."""
    if (a.dtype, a.dw_dtype, a.rank, a.layout_family) != (b.dtype, b.dw_dtype, b.rank, b.layout_family):
        return math.inf
    d = sum(abs(x - y) for x, y in zip(_features(a), _features(b)))
    return d + 2.0 * (a.filter_size != b.filter_size) + 1.0 * (a.stride != b.stride)


def select(problem: ConvBwdWeightProblem, target: Target | str, device: str | None = None,
           dbs: list[TuningDB] | None = None) -> Selection:  # fmt: skip
    """The variant for ``problem`` on ``target``: exact database hit, nearest tuned neighbour, or heuristic.

    Args:
        device: a device name (``NVIDIA H100 80GB HBM3``): only its database; None: any for the target.
        dbs: the databases to use (default :func:`databases`).

    Raises:
        ValueError: unknown target.
    """
    tgt = resolve(target)
    dbs = databases(tgt.name, device) if dbs is None else dbs
    key = problem_key(problem)
    for db in dbs:
        entry = db.entries.get(key)
        if entry is not None:
            variant = Variant.from_dict(entry["variant"])
            if variant.plan is not None:
                try:
                    check_plan(problem, variant.plan)
                except ValueError as e:  # a tuned plan this version knows to be unsafe: never replayed
                    warnings.warn(f"tuning database {db.device}: {entry['name']}: {e}; decided anew", stacklevel=2)
                    break
                if not variant.options:  # the heuristic's plan when it was tuned: named as what it is now
                    variant = replace(variant, label="tuned")
            why = f"tuned on {db.device}: {entry.get('median_s', 0) * 1e6:.1f} us"
            return Selection(variant, "exact", why, entry)
    ranked = []
    for db in dbs:
        for k, other in db.problems().items():
            entry = db.entries[k]
            if entry["variant"].get("form") != "convbw":
                continue
            d = distance(problem, other)
            if d <= NEAREST_MAX:
                ranked.append((d, entry["name"], entry, db))
    for d, _name, entry, db in sorted(ranked, key=lambda r: (r[0], r[1])):
        options = dict(entry["variant"].get("options") or {})
        try:
            plan = decide(problem, tgt, **options)
        except (PlanError, ValueError):
            continue  # the neighbour's choice does not apply here: the next neighbour
        if plan.split is not None and plan.split.dim == "n" and plan.split.padded_extent != problem.batch:
            continue  # uneven batch split: docs/decisions.md#even-splits
        variant = Variant("convbw", plan, tuple(sorted(options.items())), "nearest")
        why = f"{entry['name']} at distance {d:.2f} (tuned on {db.device}) with options {options or 'none'}"
        return Selection(variant, "nearest", why, entry)
    return Selection(heuristic(problem, tgt), "heuristic", "no tuned problem near enough")
