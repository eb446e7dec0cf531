"""Kernel variants as data: one frozen, hashable description of one kernel for one problem.

A :class:`Variant` is a *form* (what is handed to IREE) and, for our own pipeline, the
:class:`convbw_mlir.plan.Plan` it carries out plus the overrides that made that plan (so that the same
choice can be re-decided for another problem: :mod:`convbw_mlir.dispatch.select`'s nearest neighbour):

    convbw        our passes carry out ``plan`` (its strategy, split and tile; IREE's flags untouched)
    iree_direct   IREE's default on the plain linalg form (``convbw-lower-to-linalg{frontend-form}``)
    iree_torch    IREE's default on the torch-mlir form (2-D, G=1 only)
    iree_fusilli  the torch form (or the direct one) with iree-org/fusilli's weight-backward flags

:func:`candidates` yields the valid variants of a problem on a target: the heuristic's plan first, then
IREE's forms (so a measured choice can never lose to them), then plans from a small grid of overrides
(split factors, G>1 splits, our tile for grouped problems and GEMMs, tile sizes), each checked by
:func:`convbw_mlir.plan.decide` and deduplicated by the plan it makes. The grid's values are absolute
(k_batch 1, 2, 4 ... 64) so that a winning set re-applies to a neighbouring problem as it is.

This module imports without the IREE compiler.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from convbw_mlir.loops import Split
from convbw_mlir.plan import Plan, PlanError, Strategy, decide, folded_twin, one_tap_window, pick_intrinsic
from convbw_mlir.policies import sm90
from convbw_mlir.policies.amd import FORCE_FORM_ENV
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = [
    "FORMS",
    "IREE_FORMS",
    "Variant",
    "candidates",
    "heuristic",
    "known_wrong",
    "product_version",
    "request_key",
    "variant_key",
    "variant_request",
]

FORMS = ("convbw", "iree_direct", "iree_torch", "iree_fusilli")
IREE_FORMS = FORMS[1:]
# Options a variant may carry (plan.Overrides' fields that change the kernel)
OPTIONS = ("k_batch", "tile_m", "tile_n", "tile_k", "subgroups_m", "subgroups_n", "stages", "gemm", "grouped",
           "strategy", "merge_groups", "streamk", "wgmma_merge", "fold_rank", "wgmma_rows",
           "wgmma_pad_channels", "wgmma_stages")  # fmt: skip
# Options of forms the tuner tries and the learned selector never saw (``candidates(..., wgmma_rows=False)``)
UNSEEN = ("wgmma_rows", "wgmma_pad_channels", "wgmma_stages")


def known_wrong(problem: ConvBwdWeightProblem, target: Target | str, form: str) -> str | None:
    """Why IREE 3.13 computes a wrong dW for ``problem`` in ``form`` on ``target``, or None where it is not
    known to: every IREE form (direct, torch, fusilli) of a 1x1 on NVIDIA (sm_80 and sm_90a code; the host's
    is right), found again on 2026-11-26 (docs/decisions.md#iree-1x1-wrong). Our own form is never refused here.
    """
    if form not in IREE_FORMS or resolve(target).family != "nvidia" or one_tap_window(problem) is None:
        return None
    return (f"form: {form} of a 1x1 on {resolve(target).name}: IREE 3.13's CUDA codegen computes a wrong dW "
            "(docs/decisions.md#iree-1x1-wrong)")  # fmt: skip


# Split factors the grid tries (absolute, so that a winner transfers to a neighbour as it is)
K_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Variant:
    """One kernel of one problem: a form and, for ``convbw``, the plan it carries out.

    Attributes:
        form: one of :data:`FORMS`.
        plan: the plan (form ``convbw``), else None.
        options: the overrides that made ``plan`` (sorted (name, value) pairs; empty: the heuristic's).
        label: a short human name (not part of the identity).
    """

    form: str
    plan: Plan | None = None
    options: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"variant: form: expected one of {', '.join(FORMS)}, got {self.form!r}")
        if (self.form == "convbw") != (self.plan is not None):
            raise ValueError(f"variant: form {self.form} {'needs' if self.form == 'convbw' else 'takes no'} plan")
        tile = self.plan.tile if self.plan is not None else None
        if tile is not None:  # e.g. an MFMA intrinsic handed to an RDNA or NVIDIA target
            known = {i.name for options in self.plan.target_info.intrinsics.values() for i in options}
            if tile.intrinsic not in known:
                raise ValueError(f"variant: intrinsic {tile.intrinsic} does not run on {self.plan.target} "
                                 f"(its intrinsics: {', '.join(sorted(known)) or 'none'})")  # fmt: skip
        for name, _ in self.options:
            if name not in OPTIONS:
                raise ValueError(f"variant: options: unknown option {name!r}; known: {', '.join(OPTIONS)}")

    @property
    def name(self) -> str:
        """A name for tables and manifests: ``convbw[k_batch=8]``, ``iree_fusilli``."""
        if self.form != "convbw":
            return self.form
        return f"convbw[{self.label or ','.join(f'{k}={v}' for k, v in self.options) or 'heuristic'}]"

    @property
    def flags(self) -> list[str]:
        """The extra IREE flags of this variant."""
        if self.form == "iree_fusilli":
            from convbw_mlir.build.contenders import FUSILLI_FLAGS

            return list(FUSILLI_FLAGS)
        return []

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"form": self.form}
        if self.plan is not None:
            data["plan"] = self.plan.to_dict()
            data["options"] = dict(self.options)
        if self.label:
            data["label"] = self.label
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Variant:
        """The inverse of :meth:`to_dict`.

        Raises:
            ValueError: a malformed variant (naming the entry).
        """
        if not isinstance(data, dict):
            raise ValueError(f"variant: expected an object, got {type(data).__name__}")
        unknown = set(data) - {"form", "plan", "options", "label"}
        if unknown:
            raise ValueError(f"variant: unknown entries {', '.join(sorted(unknown))}")
        plan = Plan.from_dict(data["plan"]) if data.get("plan") is not None else None
        options = data.get("options") or {}
        if not isinstance(options, dict):
            raise ValueError(f"variant: options: expected an object, got {options!r}")
        return cls(data.get("form", ""), plan, tuple(sorted(options.items())), str(data.get("label", "")))


@functools.cache
def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, read from its ``*.dist-info`` folder name on
    ``sys.path`` (importing ``importlib.metadata`` costs ~30 ms, most of a cache hit's budget); None if absent."""
    import sys
    from pathlib import Path

    stem = dist.replace("-", "_").lower()
    for entry in sys.path:
        try:
            for info in Path(entry or ".").glob("*.dist-info"):
                name, _, rest = info.name[: -len(".dist-info")].partition("-")
                if name.lower() == stem and rest:
                    return rest
        except OSError:
            continue
    return None


def product_version() -> str:
    """This package's version (``0+unknown`` where it runs from a plain folder, without metadata)."""
    return dist_version("convbw-mlir") or "0+unknown"


def variant_request(problem: ConvBwdWeightProblem, target: Target | str, variant: Variant, iree_version: str,
                    extra_flags: list[str] | None = None, output_arg: bool = False) -> dict[str, Any]:  # fmt: skip
    """What a cached kernel is for: problem, target, variant (form, plan, flags), IREE's version, the
    product's version and the hash of its kernel-shaping code, and the function's ABI where it differs from
    the default (a caller-owned output argument). Its hash is the key (:func:`request_key`); the cache
    stores it beside the kernel and checks a hit against it."""
    from convbw_mlir.build import cubin
    from convbw_mlir.dispatch.code_hash import code_hash

    tgt = resolve(target)
    data = {
        "problem": problem.to_dict(),
        "target": tgt.name,
        "form": variant.form,
        "plan": variant.plan.to_dict() if variant.plan else None,
        "flags": variant.flags + list(extra_flags or []),
        "iree": iree_version,
        "product": product_version(),
        "code": code_hash(),
    }
    if output_arg:
        data["abi"] = "output-arg"
    if tgt.driver == "cuda":  # entries carry the direct launch's schedule since this format
        data["cuda_launch"] = LAUNCH_FORMAT
    if tgt.driver == "hip":  # entries carry the HIP launch's schedule and code objects since it was wired in
        data["hip_launch"] = LAUNCH_FORMAT
    if tgt.driver == "cuda" and cubin.requested():  # ptxas's cubins (build/cubin.py): another kernel image
        data["kernel_image"] = f"cubin: {cubin.version(cubin.ptxas())}"
    if os.environ.get(FORCE_FORM_ENV):  # a test's forced operand form is not the plan's kernel
        data["forced_form"] = os.environ[FORCE_FORM_ENV]
    return data


def request_key(request: dict[str, Any]) -> str:
    """The cache key of a :func:`variant_request`: sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def variant_key(problem: ConvBwdWeightProblem, target: Target | str, variant: Variant, iree_version: str,
                extra_flags: list[str] | None = None, output_arg: bool = False) -> str:  # fmt: skip
    """The cache key: :func:`request_key` of :func:`variant_request`."""
    return request_key(variant_request(problem, target, variant, iree_version, extra_flags, output_arg))


# The direct launch's schedule reader, as cached entries carry its result: 2 reads command buffers
# recorded per call (the explicit kernel's split-K), which 1 refused.
LAUNCH_FORMAT = 2


def heuristic(problem: ConvBwdWeightProblem, target: Target | str) -> Variant:
    """The heuristic's own choice: :func:`convbw_mlir.plan.decide` without overrides."""
    return Variant("convbw", decide(problem, target), (), "heuristic")


def distinct(problem: ConvBwdWeightProblem, target: Target | str, options: Iterable[tuple[str, dict[str, Any]]],
             log: Callable[[str], None] | None = None) -> list[Variant]:  # fmt: skip
    """The heuristic's variant, then each ``(label, options)`` the plan accepts whose plan no earlier one has (a
    refusal is logged, not raised: a bench's list of alternatives need not know which apply)."""
    found = [heuristic(problem, target)]
    for label, opts in options:
        try:
            plan = decide(problem, target, **opts)
        except (PlanError, ValueError) as e:
            (log or (lambda m: print(m, flush=True)))(f"  {label}: refused: {str(e).splitlines()[0]}")
            continue
        v = Variant("convbw", plan, tuple(sorted(opts.items())), label)
        if all(v.plan != w.plan for w in found):
            found.append(v)
    return found


def _sm90_grid(problem: ConvBwdWeightProblem, base: Plan) -> Iterator[dict[str, Any]]:
    """The sm_90a kernel's neighbours of the rule's (split, width, StreamK) and the sm_80 kernel: its model is
    fitted on one H100 within ~10% (convbw_mlir/policies/sm90.py) and its worst held-out losses were StreamK on
    a short reduction and a wide tile (issue 39), so the tuner measures the choices next to it."""
    kb, n = base.k_batch, base.tile.n
    near = [k for k in dict.fromkeys((2 * kb, kb // 2, kb + 1, kb - 1, 4 * kb)) if k >= 1 and k != kb]
    if base.merge is not None:  # the boxed form (thin and medium groups): its splits and widths, then sm_80's kernel
        boxed = {"strategy": "explicit", "wgmma_merge": base.merge.groups}
        yield from ({**boxed, "k_batch": k} for k in near[:2])
        yield from _sm80_kernel(problem, merged=True)
        yield from ({**boxed, "k_batch": kb, "tile_n": w} for w in (256, 192, 128) if w != n)
        yield from ({**boxed, "k_batch": k} for k in near[2:])
        return
    rows64 = list(_rows64(problem, base))
    yield from ({"strategy": "explicit", "k_batch": k} for k in near[:1])
    # unsplit first: the 64-row tile's best on the sm_80 kernel (docs/decisions.md#short-reduction-dense)
    yield from rows64[:1]
    yield from ({"strategy": "explicit", "k_batch": k} for k in near[1:2])
    yield {"strategy": "explicit", "k_batch": kb} if base.streamk else {"strategy": "explicit", "streamk": "auto"}
    widths = [w for w in (256, 192, 128) if w != n]
    yield from ({"strategy": "explicit", "k_batch": kb, "tile_n": w} for w in widths[:1])
    yield from _sm80_kernel(problem)
    yield from rows64[1:]
    yield from ({"strategy": "explicit", "k_batch": kb, "tile_n": w} for w in widths[1:])
    yield from ({"strategy": "explicit", "k_batch": k} for k in near[2:])


# The short reductions (N Ho Wo) where the tuner tries the wgmma kernel's 64-row tile on K > 64: the bound of
# docs/dispatch.md#zoo-misranks (14x14 at batch 32), where no kernel of ours beat cuDNN on dense layers (issue 39)
SHORT_DENSE_REDUCTION = 6272


def _rows64(problem: ConvBwdWeightProblem, base: Plan) -> Iterator[dict[str, Any]]:
    """The wgmma kernel's 64-row tile (one consumer warpgroup) where the plan takes two (K > 64) on a short
    reduction: unsplit and the plan's split, the plan's width and 64. Unmeasured on a GPU: the rule never picks it
    (``wgmma_rows``); cuDNN runs 64-row tiles on most of these layers and the sm_80 kernel's 64-row tile beat its
    128-row one there (docs/decisions.md#short-reduction-dense)."""
    if base.tile.subgroups_m != 2 or base.merge is not None:
        return
    if problem.batch * math.prod(problem.output_size) > SHORT_DENSE_REDUCTION:
        return
    kb, n = base.k_batch, base.tile.n
    for bn in dict.fromkeys((n, 64)):
        for k in dict.fromkeys((1, kb)):
            yield {"strategy": "explicit", "wgmma_rows": 64, "k_batch": k, "tile_n": bn}


# No deeper ring (wgmma-stages) in the grid: at the plan's own split and width a deeper ring ran 2% slower than the 4
# stages (16 tuned-model pairs, H100; pack wgmmastages' pre-written rule: out): docs/decisions.md#short-reduction-dense


def _padded(problem: ConvBwdWeightProblem, base: Plan) -> Iterator[dict[str, Any]]:
    """The wgmma kernel with each tap's channels padded to 64-channel boxes where the plan is the sm_80 kernel on
    a dense layer only because C is not a multiple of 64: the padded plan's own split, unsplit and the sm_80 plan's
    split, where the plan is still the sm_80 kernel's (more than PADDED_MAX_WASTE padded columns, or the rule's
    switch off; elsewhere the rule pads: policies/sm90.py PADDED_CHANNELS, docs/decisions.md#short-reduction-dense)."""
    if problem.groups != 1 or not sm90.takes_padded(problem):
        return
    yield {"strategy": "explicit", "wgmma_pad_channels": True}
    for k in dict.fromkeys((1, base.k_batch)):
        yield {"strategy": "explicit", "wgmma_pad_channels": True, "k_batch": k}


def _padded_plan(problem: ConvBwdWeightProblem, plan: Plan) -> bool:
    """Whether ``plan`` is the wgmma kernel with padded channels (its plain form on C % 64 != 0)."""
    return sm90.is_sm90(plan) and plan.merge is None and problem.in_channels % sm90.BOX != 0


def _sm80_kernel(problem: ConvBwdWeightProblem, merged: bool = False) -> Iterator[dict[str, Any]]:
    """The sm_80 kernel (mma.sync) on sm_90a: its M tile as sm_80's plan has it, an option the wgmma kernel has
    no knob for, so the plan hands the problem to the sm_80 kernels' rule (convbw_mlir/policies/sm90.py);
    ``merged``: the rival of the wgmma boxed form, so with the sm_80 merge rule's groups (thin groups) as well."""
    try:
        plan = decide(problem, "sm_80", strategy="explicit")
    except (PlanError, ValueError):
        return
    if plan.tile is not None:
        merge = {"merge_groups": plan.merge.groups} if merged and plan.merge is not None else {}
        yield {"strategy": "explicit", "tile_m": plan.tile.m, **merge}


def _grid(
    problem: ConvBwdWeightProblem, target: Target, base: Plan, wgmma_rows: bool = True
) -> Iterator[dict[str, Any]]:
    """Override sets to try, most promising first (docs/dispatch.md#candidates); ``wgmma_rows`` False: none
    asking for a wgmma form the learned selector never saw (:data:`UNSEEN`: the 64-row tile, padded channels, a
    deeper ring)."""
    if not wgmma_rows:
        yield from (opts for opts in _grid(problem, target, base) if not set(UNSEEN) & set(opts))
        return
    tgt = target
    if not tgt.is_gpu:
        for kb in (1, 2, 4):
            yield {"k_batch": kb}
        return
    if tgt.family == "nvidia" and folded_twin(problem)[0] is not None:  # 3-D as its 2-D twin: docs#rank-fold
        yield {"fold_rank": not base.fold_rank}  # the other of the two first: the rule (off) is unmeasured
    if sm90.is_sm90(base):  # the wgmma kernel: its split count and tile width around the rule's come first
        yield from _sm90_grid(problem, base)
    elif base.strategy == Strategy.EXPLICIT and tgt.name == "sm_90a":  # the sm_80 kernel there: its splits +-
        yield from ({"strategy": "explicit", "k_batch": k} for k in (2 * base.k_batch, base.k_batch // 2) if k >= 1)
        yield from _padded(problem, base)  # dense layers of C % 64 != 0: the padded wgmma kernel
        # groups of C < 64: the wgmma kernel's boxed form (docs/decisions.md#wgmma-groups)
        boxed = sm90.merge_for(problem)
        if boxed and problem.groups > 1 and not sm90.merge_refusals(problem, boxed):
            yield {"strategy": "explicit", "wgmma_merge": boxed}
    if base.strategy == Strategy.EXPLICIT:  # the plan chose our kernel: IREE's codegen and its grid are the rivals
        yield {"strategy": "codegen"}
        if (
            base.merge is not None
        ):  # merged thin groups: one group a GEMM is a rival too (docs/decisions.md#thin-groups)
            yield {"strategy": "explicit", "merge_groups": 1}
        try:
            base = decide(problem, target, strategy="codegen")
        except PlanError:  # no codegen plan (fp8: the fp8 GEMM only): the grid below has nothing to vary
            return
    mma = pick_intrinsic(problem, tgt) is not None
    grouped = problem.groups > 1
    kb = base.k_batch
    near = sorted(
        {k for k in K_BATCHES if kb / 4 <= k <= kb * 8} - {kb},
        key=lambda k: abs(math.log2(k / kb)) + (1.5 if k < kb else 0),
    )  # larger splits first
    splits = [{"k_batch": k} for k in near]
    # The kernel our passes write, where the problem is one it computes (decide refuses the rest):
    # 2.65x TileAndFuse on a 4096^3 GEMM (docs/explicit-kernels.md), so it is tried first.
    choices: list[dict[str, Any]] = [{"strategy": "explicit"}] if tgt.family == "nvidia" else []
    # Our tile where the heuristic hands grouped problems or GEMMs to IREE (the G>1 split family),
    # interleaved with IREE's own config over other splits.
    ours = []
    if mma and grouped and base.strategy == Strategy.IREE:
        ours = [{"grouped": "mma", "k_batch": k} for k in (1, 4, 2, 8)]
    elif base.gemm and base.strategy == Strategy.IREE:
        ours = [{"gemm": "mma", "k_batch": k} for k in (1, 4, 2, 8)]
    for i in range(max(len(ours), len(splits))):
        choices += ours[i : i + 1] + splits[i : i + 1]
    if base.tile is not None:  # the N tile halved and doubled, the reduction step halved
        t = base.tile
        choices += [{"k_batch": kb, "tile_n": t.n // 2}, {"k_batch": kb, "tile_n": t.n * 2},
                    {"k_batch": kb, "tile_k": t.k // 2}]  # fmt: skip
    if base.split is not None and base.split.promoted:  # a rows split: against batch splits
        choices += [{"k_batch": k} for k in (8, 32)]
    yield from choices


def candidates(problem: ConvBwdWeightProblem, target: Target | str, max_plans: int = 6,
               iree: bool = True, iree_forms: tuple[str, ...] = IREE_FORMS,
               wgmma_rows: bool = True) -> list[Variant]:  # fmt: skip
    """The valid variants of ``problem`` on ``target``: the heuristic's first, IREE's forms (with
    ``iree``, those of ``iree_forms``; the torch form only where it exists: 2-D, G=1, no epilogue; none
    :func:`known_wrong`), then up to ``max_plans`` further plans (``wgmma_rows`` False: none with the wgmma
    kernel's 64-row tile on K > 64, its padded channels or a deeper ring (:data:`UNSEEN`), which the tuner tries
    and the learned selector never saw).

    Raises:
        ValueError: unknown target, or a name in ``iree_forms`` that is not one of :data:`IREE_FORMS`.
    """
    bad = [f for f in iree_forms if f not in IREE_FORMS]
    if bad:
        raise ValueError(f"iree_forms: {bad[0]!r} is not one of {', '.join(IREE_FORMS)}")
    target = resolve(target)  # one clear error for an unknown target
    base = heuristic(problem, target)
    out = [base]
    if iree and target.is_gpu:
        torch_form = problem.rank == 2 and problem.groups == 1 and problem.epilogue is None
        out += [
            Variant(f)
            for f in IREE_FORMS
            if f in iree_forms and (f != "iree_torch" or torch_form) and not known_wrong(problem, target, f)
        ]
    seen = {base}
    plans = 0
    for opts in _grid(problem, target, base.plan, wgmma_rows):
        if plans >= max_plans:
            break
        try:
            plan = decide(problem, target, **opts)
        except (PlanError, ValueError):
            continue  # not a valid variant for this problem: the grid is a superset
        if plan.split is not None and plan.split.dim == "n" and plan.split.padded_extent != problem.batch:
            continue  # uneven batch splits gave NaNs in IREE's sm_80 code: docs/decisions.md#even-splits
        v = Variant("convbw", plan, tuple(sorted(opts.items())))
        if not wgmma_rows and _padded_plan(problem, plan):
            continue  # the padded wgmma kernel off the rule's own plan: the learned selector never saw it
        if v not in seen:
            seen.add(v)
            out.append(v)
            plans += 1
    return out


def row_chunk_variant(problem: ConvBwdWeightProblem, target: Target | str, k_batch: int) -> Variant:
    """The heuristic's plan with the reduction split into chunks of output rows (``o0``) instead of images.

    IREE 3.13 crashes compiling it (docs/decisions.md#no-row-chunks), so :func:`candidates` never yields
    it; it is what an isolated build must survive, and the family to enable once IREE compiles it.
    """
    rows = problem.output_size[0]
    chunk = math.ceil(rows / k_batch)
    plan = decide(problem, target, k_batch=1)
    return Variant("convbw", Plan(plan.target, plan.strategy, plan.gemm, plan.reduction_innermost,
                                  Split("o0", math.ceil(rows / chunk), chunk), plan.tile, plan.simt),
                   (), f"rows_o0x{k_batch}")  # fmt: skip
