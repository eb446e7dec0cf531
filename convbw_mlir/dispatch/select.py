"""Select: which variant computes a problem on a target, and why.

:func:`select` tries, in order:

1. ``exact``: a tuning database entry for exactly this problem (measured and verified on a device);
   then ``learned``, where a learned selector for the target is installed (``selector.<target>.json``,
   shipped only where it beat the nearest neighbour and the heuristic on held-out models: docs/dispatch.md#generalize):
   the candidate of least predicted time;
2. ``nearest``: the winner of the nearest tuned problem on the GEMM view (distance below), re-decided
   for this problem with the same overrides, where :func:`convbw_mlir.plan.decide` accepts them. Only our
   own pipeline's variants transfer: IREE's default forms were wrong on some problems (every 1x1 on
   sm_80), so they are used only where they were verified, on an exact hit, and never where
   :func:`convbw_mlir.dispatch.variants.known_wrong` names them (a stored one is decided anew, with a warning);
3. ``heuristic``: :func:`convbw_mlir.plan.decide`'s own plan.

With ``deterministic=True`` or ``max_workspace_bytes=N`` (cuDNN's frontend filters of the same names) each
path takes only a variant that meets them (:func:`convbw_mlir.plan.satisfies`: a plan's
``deterministic`` and ``workspace_bytes``; IREE's own forms are of unknown workspace, and the one with
IREE's split reduction is not called deterministic); where the heuristic's plan does not, the first
candidate (:func:`convbw_mlir.dispatch.variants.candidates`) that does; where none does, one ValueError.

Distance between problems of one element type, rank and layout family: the sum of |log2| ratios of the
GEMM view's M, N, K and groups, plus 2 where the filter differs and 1 where the strides differ. Beyond
:data:`NEAREST_MAX` (a factor 2 in one size) no neighbour is near enough.

Databases: the user's (``<cache>/tuning/*.json``, where ``convbw tune --import`` puts them) and the ones shipped
in the package (``convbw_mlir/tuning/*.json``), for the target; with ``device``, only that device's. The user's
overlay the shipped ones: the first database holding a problem's entry serves it, files named to
:func:`databases` (``convbw select --db FILE``) first, then the user's, then the shipped.
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
from convbw_mlir.dispatch.learned import TreeSelector, selector_file_name
from convbw_mlir.dispatch.variants import Variant, candidates, dist_version, heuristic, known_wrong
from convbw_mlir.plan import Decision, PlanError, check_plan, decide, plan_properties, satisfies
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = [
    "NEAREST_MAX",
    "Selection",
    "check_requests",
    "databases",
    "distance",
    "learned_selector",
    "select",
    "variant_satisfies",
]

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
    """The usable databases for ``target`` (and ``device``), in the order :func:`select` consults them:
    ``extra`` (as given), the user's, then the shipped ones; a database earlier in it overlays a later one.

    A malformed file found in a database folder is ignored with a warning, a bad entry left out with one.

    Raises:
        ValueError: a file of ``extra`` that cannot be read, is not a database, or is for another target or
            IREE version (naming it): asked for by name, it is used or refused, never passed over.
    """
    iree = _version()
    for p in extra or []:  # asked for by name: an error, not a warning
        try:
            db = TuningDB.load(p)
        except OSError as e:
            raise ValueError(f"--db: cannot read {p}: {e.strerror or e}") from None
        except DatabaseError as e:
            raise ValueError(f"--db: {e}") from None
        if db.target != target:
            raise ValueError(f"--db: {p} is a database for target {db.target}, not {target}")
        if db.iree_version != iree:
            raise ValueError(f"--db: {p} was measured with IREE {db.iree_version}, this is {iree}")
    from convbw_mlir.dispatch.cache import default_cache_dir

    folders: list[Any] = [default_cache_dir() / "tuning", SHIPPED]  # the user's overlay the shipped
    paths: list[Path] = [Path(p) for p in extra or []]
    suffix = f".{target}.json"
    for folder in folders:
        names = [n for n in _listing(folder) if n.endswith(suffix) and n != selector_file_name(target)]
        if device is not None:
            names = [n for n in names if n == db_file_name(device, target)]
        paths += [Path(str(folder / n)) for n in names]
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


def check_requests(deterministic: Any = False, max_workspace_bytes: Any = None) -> None:
    """Refuse a request that is not one: ``deterministic`` a bool, ``max_workspace_bytes`` None or an integer >= 0.

    Raises:
        TypeError, ValueError: naming the field and the value.
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    if max_workspace_bytes is not None:
        if isinstance(max_workspace_bytes, bool) or not isinstance(max_workspace_bytes, int):
            raise TypeError(
                f"max_workspace_bytes: expected an integer number of bytes or None, got {max_workspace_bytes!r}"
            )
        if max_workspace_bytes < 0:
            raise ValueError(f"max_workspace_bytes: expected 0 or more bytes, got {max_workspace_bytes}")


def variant_satisfies(problem: ConvBwdWeightProblem, variant: Variant, deterministic: bool = False,
                      max_workspace_bytes: int | None = None) -> bool:  # fmt: skip
    """Whether ``variant`` meets the requests (see the module docstring); always without any."""
    if not deterministic and max_workspace_bytes is None:
        return True
    if variant.plan is None:  # IREE's own forms: workspace unknown; its split reduction sums in no fixed order
        return max_workspace_bytes is None and not any("split-reduction" in f for f in variant.flags)
    return satisfies(plan_properties(problem, variant.plan), deterministic, max_workspace_bytes)


_SELECTORS: dict[tuple[str, float], TreeSelector | None] = {}


def learned_selector(target: str) -> TreeSelector | None:
    """The learned selector for ``target``: the user's (``<cache>/tuning/``), else the shipped one, else None.
    A file that does not load is ignored with a warning."""
    from convbw_mlir.dispatch.cache import default_cache_dir

    for folder in (default_cache_dir() / "tuning", SHIPPED):
        path = Path(str(folder / selector_file_name(target)))
        try:
            stamp = (str(path), path.stat().st_mtime)
        except OSError:
            continue
        if stamp not in _SELECTORS:
            try:
                _SELECTORS[stamp] = TreeSelector.load(path)
            except ValueError as e:
                warnings.warn(f"{e}: ignored", stacklevel=3)
                _SELECTORS[stamp] = None
        if _SELECTORS[stamp] is not None:
            return _SELECTORS[stamp]
    return None


def select(problem: ConvBwdWeightProblem, target: Target | str, device: str | None = None,
           dbs: list[TuningDB] | None = None, *, deterministic: bool = False,
           max_workspace_bytes: int | None = None,
           selector: TreeSelector | None | bool = None) -> Selection:  # fmt: skip
    """The variant for ``problem`` on ``target``: exact database hit, nearest tuned neighbour, or heuristic.

    Args:
        device: a device name (``NVIDIA H100 80GB HBM3``): only its database; None: any for the target.
        dbs: the databases to use (default :func:`databases`).
        deterministic: only a variant whose dW is bitwise the same run after run.
        max_workspace_bytes: only a variant needing at most this much workspace (``plan.workspace_bytes``).
        selector: a learned selector; None: the installed one (:func:`learned_selector`); False: none.

    Raises:
        ValueError: unknown target; no variant meets ``deterministic`` and ``max_workspace_bytes`` (naming them).
        TypeError: a request of the wrong type.
    """
    check_requests(deterministic, max_workspace_bytes)
    tgt = resolve(target)
    dbs = databases(tgt.name, device) if dbs is None else dbs
    wants = {"deterministic": deterministic, "max_workspace_bytes": max_workspace_bytes}
    key = problem_key(problem)
    for db in dbs:
        entry = db.entries.get(key)
        if entry is not None:
            variant = Variant.from_dict(entry["variant"])
            wrong = known_wrong(problem, tgt, variant.form)
            if wrong is not None:  # an IREE form stored before its class was known wrong: never replayed
                warnings.warn(f"tuning database {db.device}: {entry['name']}: {wrong}; decided anew", stacklevel=2)
                break
            if variant.plan is not None:
                try:
                    check_plan(problem, variant.plan)
                except ValueError as e:  # a tuned plan this version knows to be unsafe: never replayed
                    warnings.warn(f"tuning database {db.device}: {entry['name']}: {e}; decided anew", stacklevel=2)
                    break
                tuned = Decision("tuned", "a tuning database's entry for exactly this problem: measured fastest and "
                                 f"verified on {db.device}", f"entry {entry['name']}", variant.options)  # fmt: skip
                variant = replace(variant, plan=replace(plan_properties(problem, variant.plan), decision=tuned))
                if not variant.options:  # the heuristic's plan when it was tuned: named as what it is now
                    variant = replace(variant, label="tuned")
            if not variant_satisfies(problem, variant, **wants):
                break  # the measured winner does not meet the requests: the paths below, filtered
            why = f"tuned on {db.device}: {entry.get('median_s', 0) * 1e6:.1f} us"
            return Selection(variant, "exact", why, entry)
    learned = (
        learned_selector(tgt.name) if selector is None else selector if isinstance(selector, TreeSelector) else None
    )
    if learned is not None:
        options = [
            v
            for v in candidates(problem, tgt, iree=False, wgmma_rows=False)  # the selector's trees never saw them
            if satisfies(v.plan, deterministic, max_workspace_bytes)
        ]
        if options:
            trained = learned.meta.get("problems")
            why = f"least predicted time of {len(options)} candidates (trained on {trained} problems)"
            chosen = learned.choose(problem, options)
            return Selection(_chosen_by(chosen, LEARNED, why), "learned", why)
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
        if not satisfies(plan, deterministic, max_workspace_bytes):
            continue
        variant = Variant("convbw", plan, tuple(sorted(options.items())), "nearest")
        why = f"{entry['name']} at distance {d:.2f} (tuned on {db.device}) with options {options or 'none'}"
        return Selection(_chosen_by(variant, NEAREST, why), "nearest", why, entry)
    base = heuristic(problem, tgt)
    if satisfies(base.plan, deterministic, max_workspace_bytes):
        return Selection(base, "heuristic", "no tuned problem near enough")
    return _constrained(problem, tgt, base, deterministic, max_workspace_bytes)


# What chose a plan besides a rule of plan.RULES (op.plan and ``convbw select`` name it; the rule that made the
# plan with the chosen options follows it as ``then``)
LEARNED = ("learned", "the installed learned selector's least predicted time among the candidates")
NEAREST = ("nearest", "a tuned neighbour's options, decided again for this problem")
CONSTRAINED = ("constrained", "the first candidate in the tuner's order meeting deterministic / max_workspace_bytes")


def _chosen_by(variant: Variant, chooser: tuple[str, str], detail: str) -> Variant:
    """``variant`` with its plan's decision naming ``chooser`` (name, reason) first, then the rule that made it."""
    if variant.plan is None:
        return variant
    made = variant.plan.decision
    why = Decision(chooser[0], chooser[1], detail, variant.options, then=made)
    return replace(variant, plan=replace(variant.plan, decision=why))


# Plan variants tried for a request the heuristic's plan does not meet (the tuner's grid, all of it), then
# the unsplit plans (the least workspace: no partials; the explicit kernel reads the padding in place).
CONSTRAINED_PLANS = 64
UNSPLIT = ({"strategy": "explicit", "k_batch": 1}, {"k_batch": 1})


def _constrained(problem: ConvBwdWeightProblem, tgt: Target, base: Variant, deterministic: bool,
                 max_workspace_bytes: int | None) -> Selection:  # fmt: skip
    """The first candidate plan meeting the requests, in the tuner's order (the heuristic's first).

    Raises:
        ValueError: none does: naming the request and the least workspace a plan needs.
    """
    found = candidates(problem, tgt, max_plans=CONSTRAINED_PLANS, iree=False, wgmma_rows=False)  # unmeasured: not here
    plans = [v for v in found if v.plan is not None]
    for opts in UNSPLIT:
        try:
            plans.append(Variant("convbw", decide(problem, tgt, **opts), tuple(sorted(opts.items()))))
        except (PlanError, ValueError):
            continue  # e.g. no explicit kernel of ours for this problem or target
    for v in plans:
        if satisfies(v.plan, deterministic, max_workspace_bytes):
            why = (f"the heuristic's plan needs {base.plan.workspace_bytes} bytes of workspace"
                   if max_workspace_bytes is not None and base.plan.workspace_bytes > max_workspace_bytes
                   else "the heuristic's plan is not deterministic")  # fmt: skip
            why = f"{why}: the first candidate within"
            return Selection(_chosen_by(v, CONSTRAINED, why), "heuristic", why)
    if deterministic and not any(v.plan.deterministic for v in plans):
        raise ValueError(f"deterministic: True: no plan of {problem.name} on {tgt.name} is deterministic")
    least = min(plans, key=lambda v: v.plan.workspace_bytes)
    raise ValueError(f"max_workspace_bytes: {max_workspace_bytes}: every plan of {problem.name} on {tgt.name} "
                     f"needs more (the least: {least.plan.workspace_bytes} bytes, {least.name})")  # fmt: skip
