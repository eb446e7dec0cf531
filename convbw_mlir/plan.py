"""The plan: every decision about how one problem is computed on one target, made once, here.

:func:`decide` turns (problem, target, overrides) into a frozen :class:`Plan`: whether the problem is
carried out as a GEMM, how its reduction is split (split-K), and the strategy with its tile:

    mma   our matrix-core tile (workgroup M x N, reduction step, subgroups, prefetch) for IREE's
          TileAndFuse pipeline, with the target's MFMA / WMMA / MMA intrinsic
    simt  no matrix instructions (depthwise, thin groups): a thread per (image, row, group, channel)
          over a rows split, else IREE's own reduction codegen over a batch split
    iree  IREE's own configuration (and the host's CPU codegen)
    explicit  a whole kernel our passes write (``convbw_mlir/kernels``): the implicit GEMM, or for depthwise
          problems the depthwise kernel (``plan.depthwise``, convbw_mlir/policies/depthwise.py)

The passes only carry a plan out: ``convbw-plan`` attaches it to each ``convbw.conv_bwd_weight`` as
its ``plan`` attribute (it prints and parses, so a pipeline replays from text), ``convbw-explicit-gemm``
and ``convbw-split-k`` rewrite the op as it says, ``convbw-lower-to-linalg`` copies it onto the
contraction, ``convbw-tile`` and ``convbw-map-mma`` turn it into IREE's ``compilation_info``. A plan is
also the unit a tuner enumerates, stores and replays (:meth:`Plan.to_dict`, :meth:`Plan.from_dict`).

This module imports without the IREE compiler. Each measured rule links its data in docs/decisions.md.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from convbw_mlir import policies
from convbw_mlir.loops import Contraction, Split, check_split, input_pads
from convbw_mlir.plan_data import (
    LAYOUT4_FORMS,
    STRATEGY_OPTIONS,
    Decision,
    Overrides,
    Plan,
    PlanError,
    SimtTile,
    Strategy,
    StreamKPlan,
    Tile,
    WaveSpecPlan,
    _is_int,
    _spelled,
    _target,
)
from convbw_mlir.policies import depthwise, gemv, sm80, sm90_fp8, switches
from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem, fold_rank
from convbw_mlir.targets import Intrinsic, Target

# The plan's data types are plan_data's; they are named here too, where users look for them.
__all__ = [
    "LAYOUT4_FORMS",
    "RULES",
    "STRATEGY_OPTIONS",
    "Decision",
    "Overrides",
    "Plan",
    "PlanError",
    "Rule",
    "SimtTile",
    "Split",
    "Strategy",
    "StreamKPlan",
    "Tile",
    "WaveSpecPlan",
    "as_gemm",
    "check_plan",
    "choose_simt_tile",
    "computed_problem",
    "choose_tile",
    "decide",
    "effective_problem",
    "explicit_tiling",
    "folded_twin",
    "one_tap_window",
    "pick_intrinsic",
    "plan_properties",
    "plan_rows_split",
    "relayout",
    "plan_split",
    "plan_split_k",
    "plan_workspace_bytes",
    "satisfies",
]


log = logging.getLogger("convbw_mlir.plan")  # decide's rule and reason for each plan, at DEBUG


# -- the one entry ------------------------------------------------------------------------------------
def decide(problem: ConvBwdWeightProblem, target: Target | str, split: Split | None = None, **overrides: Any) -> Plan:
    """Every decision for ``problem`` on ``target``.

    Args:
        problem: the problem as the user gave it.
        target: a :class:`~convbw_mlir.targets.Target` or a target name (:data:`convbw_mlir.targets.TARGETS`).
        split: a split already made (an op that arrives split); None lets the plan choose.
        **overrides: fields of :class:`Overrides`.

    Returns:
        the plan, its :attr:`~Plan.workspace_bytes` and :attr:`~Plan.deterministic` filled
        (:func:`plan_properties`), and its :attr:`~Plan.decision`: the rule of :data:`RULES` that made it and
        why (also logged at DEBUG by the logger ``convbw_mlir.plan``).

    Raises:
        PlanError: an unknown target or override, a value out of range, a tile the target cannot run,
            or a tile given for a problem whose strategy takes none.
    """
    _check_streamk_epilogue(problem, overrides.get("streamk"))
    plan = plan_properties(problem, _decide(problem, target, split, **overrides))
    log.debug("%s on %s: %s", problem.name, plan.target, plan.decision)
    return plan


def _check_streamk_epilogue(problem: ConvBwdWeightProblem, streamk: Any) -> None:
    """StreamK with an epilogue: refused for that reason first, on any strategy and target (every StreamK kernel
    writes dW plain), rather than for a missing ``strategy`` or the layout the user would then fix in vain."""
    if problem.epilogue is not None and (streamk == "auto" or (_is_int(streamk) and streamk >= 1)):
        raise PlanError(f"streamk: {streamk!r} with the {problem.epilogue.kind} epilogue (StreamK writes dW plain; "
                        "a split carries the epilogue in its sum)")  # fmt: skip


def _decide(problem: ConvBwdWeightProblem, target: Target | str, split: Split | None = None, **overrides: Any) -> Plan:
    """The plan of the first rule of :data:`RULES` that applies and makes one, its :class:`Decision` recorded."""
    tgt = _target(target, "target")
    try:
        opts = Overrides(**overrides)
    except TypeError:
        known = ", ".join(_spelled(f.name) for f in fields(Overrides))
        unknown = ", ".join(_spelled(k) for k in overrides if k not in {f.name for f in fields(Overrides)})
        raise PlanError(f"options: unknown {unknown}; known: {known}") from None
    ask = _Ask(problem, tgt, split, opts, overrides)
    for rule in RULES:
        if rule.applies(ask):
            plan = rule.make(ask)
            if plan is not None:
                return replace(plan, decision=ask.decision(rule, plan))
            if all(name != rule.name for name, _ in ask.declined):  # it applied, yet made none: say so
                ask.declined.append((rule.name, ""))
    raise AssertionError("plan: no rule applied (the last, codegen, always does)")  # pragma: no cover


# -- the rules, in order -------------------------------------------------------------------------------
class _Ask:
    """One decision's inputs and what its rules share, each computed once and only when a rule needs it, in
    the order the rules ask (so a refusal of an option comes from the same step it always came from)."""

    def __init__(self, problem: ConvBwdWeightProblem, tgt: Target, split: Split | None, opts: Overrides,
                 overrides: dict[str, Any]) -> None:  # fmt: skip
        self.given, self.tgt, self.given_split, self.opts, self.overrides = problem, tgt, split, opts, overrides
        self.declined: list[tuple[str, str]] = []  # rules that applied and made no plan, and why

    @functools.cached_property
    def problem(self) -> ConvBwdWeightProblem:
        """The problem the passes compute (``convbw-relayout``)."""
        return relayout(self.given)

    @functools.cached_property
    def plain(self) -> bool:
        """No options and no split given: the plan's own choice (``fold-rank`` aside: the folded problem's plan is
        its own choice)."""
        return replace(self.opts, fold_rank=None) == Overrides() and self.given_split is None

    @functools.cached_property
    def work(self) -> ConvBwdWeightProblem:
        return effective_problem(self.problem, self.opts.reduction_innermost)

    @functools.cached_property
    def split(self) -> Split | None:
        """The split given, else the plan's (on the target ``plan-for`` names, if given)."""
        planner = _target(self.opts.plan_for, "plan-for") if self.opts.plan_for else self.tgt
        work = self.work
        return self.given_split if self.given_split is not None else plan_split_k(work, planner, self.opts.k_batch)

    @functools.cached_property
    def base(self) -> Plan:
        """IREE's own codegen of the GEMM form and split decided."""
        gemm = self.work is not self.problem
        return Plan(self.tgt.name, Strategy.IREE, gemm, self.opts.reduction_innermost and gemm, self.split)

    @functools.cached_property
    def codegen(self) -> Plan:
        """The codegen plan (strategy mma, simt or iree) of a GPU target."""
        return _gpu_strategy(self.base, self.work, self.tgt, self.opts)

    def decision(self, rule: Rule, plan: Plan) -> Decision:
        """The record of ``rule`` making ``plan`` (a rule that decided again in another form: that decision after)."""
        inner = plan.decision
        then = inner if inner is not None and inner.rule != _NOTE else None
        notes = [inner.detail] if inner is not None and inner.rule == _NOTE else []
        if then is None:  # what the plan is (a rule that decided again: its decision says), then what chose it
            kernel = _kernel_of(plan) if plan.strategy == Strategy.EXPLICIT else None
            notes = ([kernel] if kernel and kernel not in rule.reason else []) + notes  # a reason naming it: once
            if plan.strategy == Strategy.MMA:
                notes.append(f"mma: our tile {plan.tile.m}x{plan.tile.n}x{plan.tile.k} ({plan.tile.intrinsic})")
            notes += [f"split-K: {plan.split.k_batch} over {plan.split.dim}"] if plan.split is not None else []
        notes += [f"{name} declined" + (f": {why}" if why else "") for name, why in self.declined]
        options = tuple((k, v) for k, v in self.overrides.items() if v != getattr(Overrides(), k))
        return Decision(rule.name, rule.reason, "; ".join(notes), options, then)


@dataclass(frozen=True)
class Rule:
    """One rule of the plan: where it applies, the plan it makes there, and why (:data:`RULES`).

    Attributes:
        name: short and stable (``convbw select`` prints it; tests and docs name it).
        when: where it applies, in words (``applies`` is the test).
        reason: one line: why this plan there (the measurement or the fact behind it, with its docs link).
        applies: whether the rule applies to a decision (cheap; no refusal raised).
        make: the plan; None where the rule declines after all (the next rule is asked), a PlanError where an
            option asked for cannot be carried out.
    """

    name: str
    when: str
    reason: str
    applies: Callable[[_Ask], bool]
    make: Callable[[_Ask], Plan | None]


def _fp8(a: _Ask) -> Plan:
    if a.given_split is not None:
        raise PlanError(f"split: {a.given_split.k_batch} (an fp8 op arrives unsplit: the fp8 GEMM splits it itself)")
    if a.opts.wgmma_rows is not None:
        raise PlanError(f"wgmma-rows: {a.opts.wgmma_rows} (the fp8 GEMM takes k-batch and tile-n only)")
    if a.opts.wgmma_pad_channels:
        raise PlanError("wgmma-pad-channels: true (the fp8 GEMM takes k-batch and tile-n only)")
    if a.opts.wgmma_stages is not None:
        raise PlanError(f"wgmma-stages: {a.opts.wgmma_stages} (the fp8 GEMM takes k-batch and tile-n only)")
    return sm90_fp8.plan(a.given, a.tgt, a.opts)


def folded_twin(problem: ConvBwdWeightProblem) -> tuple[ConvBwdWeightProblem | None, str]:
    """The 2-D problem the passes compute ``problem`` as where a plan folds its rank (:attr:`Plan.fold_rank`):
    :func:`convbw_mlir.problem.fold_rank` of the problem :func:`relayout` computes; None and why where it does
    not apply."""
    return fold_rank(relayout(problem))


def _fold_applies(a: _Ask) -> bool:
    """fold-rank asked for, or the plan's own choice on NVIDIA behind switch FOLD_RANK_BY_DEFAULT (off)."""
    if a.opts.fold_rank is None:
        return switches.FOLD_RANK_BY_DEFAULT and a.tgt.family == "nvidia" and a.given.rank == 3
    return a.opts.fold_rank


def _fold(a: _Ask) -> Plan | None:
    """The plan of the problem's 2-D twin (its own choice, or the options given), marked :attr:`Plan.fold_rank`;
    None where the fold does not apply and was not asked for.

    Raises:
        PlanError: fold-rank asked for where it does not apply (naming why) or for an op that arrives split.
    """
    twin, why = folded_twin(a.given)
    if twin is None or a.given_split is not None:
        if not a.opts.fold_rank:
            return None
        why = why if twin is None else f"split {a.given_split.k_batch} (an op that arrives split: the 3-D problem's)"
        raise PlanError(f"fold-rank: true for {a.given.name}: {why}")
    rest = {k: v for k, v in a.overrides.items() if k != "fold_rank"}
    return replace(_decide(twin, a.tgt, None, fold_rank=False, **rest), fold_rank=True)


def _asked_explicit(a: _Ask) -> Plan:
    if a.opts.plan_for:  # its refusal first, as ever; the split is the kernel's own (k tiles, not images)
        _target(a.opts.plan_for, "plan-for")
    return _explicit(a.problem, a.tgt, a.opts)


def _depthwise_by_default(a: _Ask) -> Plan:
    a.codegen  # noqa: B018 - decided first, as ever: a refusal there comes before this rule
    return depthwise.plan(a.problem, a.tgt, a.opts)


def _explicit_by_default(a: _Ask) -> Plan | None:
    try:
        return _explicit(a.problem, a.tgt, a.opts)
    except PlanError as e:  # e.g. no tiling fits the target's shared memory: IREE's codegen then
        a.declined.append(("explicit-by-default", str(e)))
        return None


#: The plan's rules, in order: the first that applies and makes a plan decides (:func:`decide`). The order is the
#: semantics: fp8 before everything (one kernel computes it), the layout-4 forms before the strategy (they decide
#: in layout 2 by these same rules), what is asked for before the plan's own choices, the switches' kernels
#: (policies/switches.py) before codegen.
RULES: tuple[Rule, ...] = (
    Rule("fp8", "x and dy in an fp8 type",
         "one kernel computes fp8: the sm_90a fp8 GEMM; every other target refuses fp8 by name "
         "(docs/explicit-kernels.md, fp8)",
         lambda a: a.given.is_fp8, _fp8),
    Rule("fold-rank", "asked for: fold-rank=true; or no fold-rank option, NVIDIA, a 3-D problem the fold takes; "
         "switch FOLD_RANK_BY_DEFAULT (off)",
         "a 3-D problem with a unit filter extent computed as its 2-D twin by reshapes (depth into the batch, or H "
         "and W into one axis), planned by these same rules (docs/decisions.md#rank-fold)",
         _fold_applies, _fold),
    Rule("layout4-fold", "asked for: layout4=fold",
         "asked for: layout 4's implicit GEMM without a gather (x's windows by cp.async, each tap's shift in "
         "shared memory)",
         lambda a: a.opts.layout4 == "fold", lambda a: _layout4(a.problem, a.tgt, a.given_split, a.opts, a.overrides)),
    Rule("layout4-as-layout2", "a layout-4 or layout-0 problem, or layout4 asked for (declines off NVIDIA)",
         "computed in layout 2 between transposes where the plan there is one of our channels-last kernels "
         "(docs/decisions.md#layout4), and layout 0 always (IREE's own forms of it were wrong)",
         lambda a: a.opts.layout4 is not None or a.problem.layout in CHANNELS_FIRST,
         lambda a: _layout4(a.problem, a.tgt, a.given_split, a.opts, a.overrides)),
    Rule("explicit-asked", "asked for: strategy=explicit",
         "asked for: the target's kernel of ours (on NVIDIA the depthwise kernel for depthwise problems and thin "
         "groups the implicit GEMM refuses; on sm_90a the wgmma kernel where it takes the problem, else sm_80's)",
         lambda a: a.opts.strategy == Strategy.EXPLICIT, _asked_explicit),
    Rule("gemv-asked", "asked for: strategy=gemv",
         "asked for: the split-reduction GEMV kernel (NVIDIA, layout 2; policies/gemv.py); refused by name elsewhere",
         lambda a: a.opts.strategy == "gemv", lambda a: gemv.plan(a.problem, a.tgt, a.opts)),
    Rule("host", "a CPU target",
         "IREE's own LLVM CPU codegen: no kernel or tile of ours for the host",
         lambda a: not a.tgt.is_gpu, lambda a: _no_tile(a.base, a.opts, "IREE's CPU codegen")),
    Rule("depthwise-by-default", "no options; NVIDIA; a depthwise problem or groups of at most GROUPED_BY_DEFAULT "
         "channels the implicit GEMM does not merge; switch DEPTHWISE_BY_DEFAULT",
         "the depthwise kernel: measured faster than codegen on depthwise layers and on 4-channel groups "
         "(docs/decisions.md#depthwise-by-default, #thin-groups)",
         lambda a: a.plain and depthwise.takes_by_default(a.problem, a.tgt), _depthwise_by_default),
    Rule("short-reduction-codegen", "no options; sm_90a; a plain GEMM of a very short reduction and few weights "
         "(sm90.short_reduction: channels as narrow as measured, no narrower); switch SHORT_REDUCTION_CODEGEN",
         "IREE's codegen: our kernels' start-up outweighs a reduction this short (an SE block's 1x1 at batch 32; "
         "docs/decisions.md#short-reduction-codegen)",
         lambda a: a.plain and switches.SHORT_REDUCTION_CODEGEN and policies.for_target(a.tgt) is policies.sm90
         and policies.sm90.short_reduction(a.problem), lambda a: a.codegen),
    Rule("explicit-by-default", "no options; the target's kernel takes the problem by default, and it is not too "
         "thin for matrix cores or its thin groups merge (switch MERGE_BY_DEFAULT; on sm_90a also the wgmma "
         "boxed form's rule, switch WGMMA_MERGE_BY_DEFAULT, off)",
         "our kernel where it was measured the fastest correct one for the problem's class "
         "(docs/decisions.md#explicit-by-default, #thin-groups)",
         lambda a: a.opts.strategy is None and a.plain and _explicit_wins(a.problem, a.tgt, a.codegen),
         _explicit_by_default),
    Rule("gemv-by-default", "no options; NVIDIA; K or C at most gemv.MAX_NARROW in at most gemv.MAX_GROUPS groups, "
         "where codegen's plan is SIMT (too thin for matrix cores) and each lane walks at least gemv.MIN_STEPS "
         "positions; switch GEMV_BY_DEFAULT",
         "the split-reduction GEMV kernel: the reduction spread over every SM where codegen reduces serially "
         "(docs/decisions.md#gemv-by-default)",
         lambda a: a.plain and gemv.takes_by_default(a.problem, a.tgt, a.codegen),
         lambda a: gemv.plan(a.problem, a.tgt, a.opts)),
    Rule("codegen", "everything else",
         "IREE compiles it by our plan: a matrix-core tile, SIMT where too thin for matrix cores, or IREE's own "
         "configuration, split-K by the occupancy rule (docs/decisions.md#strategy-choice)",
         lambda a: True, lambda a: a.codegen),
)  # fmt: skip

_NOTE = ""  # a Decision of no rule: a note the codegen plan carries up to its rule (why IREE's own config)


def _kernel_of(plan: Plan) -> str:
    """Which kernel of ours an explicit plan is, in words."""
    from convbw_mlir.policies import sm90

    if plan.depthwise is not None:
        return "the depthwise kernel"
    if plan.gemv is not None:
        return "the split-reduction GEMV kernel"
    if sm90_fp8.is_fp8(plan):
        return "the sm_90a fp8 GEMM"
    if sm90.is_sm90(plan):
        return "the sm_90a wgmma kernel"
    if plan.target_info.family != "nvidia":
        return f"the {plan.target_info.family.upper()} kernel"
    kernel = "the sm_80 implicit GEMM" + (" (folded)" if plan.folded else "")
    if plan.target_info.wgmma_n:
        kernel += " (the sm_90a kernel does not take the problem)"
    return kernel + (f", {plan.merge.groups} groups merged" if plan.merge is not None else "")


def _layout4(problem: ConvBwdWeightProblem, tgt: Target, split: Split | None, opts: Overrides,
             overrides: dict[str, Any]) -> Plan | None:  # fmt: skip
    """A layout-4 problem's plan on NVIDIA computed in layout 2 (:attr:`Plan.channels_last`): the plan of the
    same problem in layout 2 where that is one of our kernels (the channels-last implicit GEMM with its
    ``cp.async`` copies and register path, or the depthwise kernel), else None (the layout-4 plan: the gathered
    kernel or codegen). A plain 1x1 (stride 1, unpadded: layout 4's kernel gathers nothing there) keeps its
    layout-4 plan. Option ``layout4`` asks for one form; a strategy asked for without it keeps layout 4's own
    forms (docs/decisions.md#layout4).

    Raises:
        PlanError: ``layout4`` given for a problem not in layout 4, ``relayout`` off NVIDIA or where the
            layout-2 plan is no kernel of ours.
    """
    if problem.layout not in CHANNELS_FIRST:
        raise PlanError(f"layout4: {opts.layout4} applies to layout-4 problems ({LAYOUT_4}), not {problem.layout}")
    if problem.layout == LAYOUT_0 and opts.layout4 in ("fold", "gather"):  # layout 4's own kernels, not layout 0's
        raise PlanError(f"layout4: {opts.layout4} is layout 4's kernel ({LAYOUT_4}), not layout 0's ({LAYOUT_0})")
    if opts.layout4 == "fold":  # layout 4's kernel without a gather: its policy's plan
        if tgt.family != "nvidia":
            raise PlanError(f"layout4: fold is written for NVIDIA targets (sm_80), not {tgt.name}")
        if opts.strategy not in (None, Strategy.EXPLICIT.value):
            raise PlanError(f"layout4: fold is an explicit kernel of ours, not strategy {opts.strategy}")
        chosen = _explicit(problem, tgt, replace(opts, strategy=Strategy.EXPLICIT.value))
        if not chosen.folded:
            raise PlanError("layout4: fold is the implicit GEMM's form, not the depthwise kernel's")
        return chosen
    # layout 0 on NVIDIA: every form in layout 2 (IREE's own forms of it were wrong: LAYOUT_0), options or not
    zero = problem.layout == LAYOUT_0 and tgt.family == "nvidia" and split is None
    if not zero and (opts.layout4 == "gather" or (opts.layout4 is None and opts.strategy is not None)):
        return None  # a strategy asked for alone keeps layout 4's own forms (explicit: the gathered kernel)
    if tgt.family != "nvidia":
        if opts.layout4 == "relayout":
            raise PlanError(f"layout4: relayout is written for NVIDIA targets, not {tgt.name}")
        return None
    if opts.layout4 is None and problem.layout == LAYOUT_4 and policies.sm80.gemm_shape(problem).conv is None:
        return None  # a plain 1x1: layout 4's kernel copies both operands by cp.async already (nothing gathered)
    if split is not None:  # an op that arrives split yields partial sums, not dW: nothing to transpose back
        if opts.layout4 == "relayout":
            raise PlanError("layout4: relayout of an op that arrives split (its result is partial sums)")
        return None
    rest = {k: v for k, v in overrides.items() if k != "layout4"}
    # on sm_90a the copies take the sm_90a kernel: the launcher encodes its maps on the transient's copies
    try:
        plan = _decide(problem.with_(layout=LAYOUT_2), tgt, split, **rest)
    except PlanError:
        if opts.layout4 == "relayout":
            raise
        return None  # e.g. StreamK: written for layout 4 only
    if plan.strategy != Strategy.EXPLICIT and not zero:
        if opts.layout4 == "relayout":
            raise PlanError(f"layout4: relayout computes layout 2 by our kernels; the plan there is "
                            f"{plan.strategy.value} (add strategy=explicit)")  # fmt: skip
        return None
    return replace(plan, channels_last=True)


def _explicit_wins(problem: ConvBwdWeightProblem, tgt: Target, codegen: Plan) -> bool:
    """Whether the plan's own choice is the explicit kernel: the target's kernel family takes the problem
    by default (:func:`convbw_mlir.policies.sm80.takes_by_default`: where it was the fastest correct kernel
    when measured) and it is not too thin for matrix cores (codegen's choice is not SIMT), or it is, one group at a
    time, and the kernel's rule merges its groups (:func:`convbw_mlir.policies.sm80.merge_rule`, behind its switch
    :data:`~convbw_mlir.policies.switches.MERGE_BY_DEFAULT`)."""
    policy = policies.for_target(tgt)
    # thin groups too thin for matrix cores one at a time fill them merged (docs/decisions.md#thin-groups)
    nvidia = policy is sm80 or policy is policies.sm90  # sm_90a's policy hands thin groups to the sm_80 kernel
    thin_merged = nvidia and switches.MERGE_BY_DEFAULT and sm80.merge_rule(problem, tgt) > 1
    # the wgmma kernel's boxed form, where its rule (off by default: docs/decisions.md#wgmma-groups) takes the groups
    thin_merged = thin_merged or (policy is policies.sm90 and policies.sm90.merge_rule(problem, tgt) > 0)
    return (
        policy is not None and (codegen.strategy != Strategy.SIMT or thin_merged) and policy.takes_by_default(problem)
    )


def _explicit(problem: ConvBwdWeightProblem, tgt: Target, opts: Overrides) -> Plan:
    """The explicit strategy's plan, as the target's kernel family's policy makes it (on NVIDIA, the depthwise
    kernel's for a depthwise problem it takes)."""
    policy = policies.for_target(tgt)
    if opts.wgmma_merge is not None and policy is not policies.sm90:
        raise PlanError(f"wgmma-merge: {opts.wgmma_merge} on target {tgt.name} (the wgmma kernel's boxed form is "
                        "written for sm_90a)")  # fmt: skip
    if opts.wgmma_rows is not None and policy is not policies.sm90:
        raise PlanError(f"wgmma-rows: {opts.wgmma_rows} on target {tgt.name} (the wgmma kernel is written for "
                        "sm_90a)")  # fmt: skip
    if opts.wgmma_pad_channels and policy is not policies.sm90:
        raise PlanError(f"wgmma-pad-channels: true on target {tgt.name} (the wgmma kernel is written for sm_90a)")
    if opts.wgmma_stages is not None and policy is not policies.sm90:
        raise PlanError(f"wgmma-stages: {opts.wgmma_stages} on target {tgt.name} (the wgmma kernel is written for "
                        "sm_90a)")  # fmt: skip
    asked = opts.merge_groups is not None or opts.wgmma_merge is not None or opts.wgmma_rows is not None
    asked = asked or opts.wgmma_pad_channels or opts.wgmma_stages is not None
    if tgt.family == "nvidia" and not depthwise.takes(problem) and not asked:
        # depthwise always; thin groups where the implicit GEMM refuses them (odd channel counts a group)
        if depthwise.is_depthwise(problem) or policy.unsupported(problem, None):
            return depthwise.plan(problem, tgt, opts)
    if policy is None:
        raise PlanError(
            f"strategy: explicit kernels are written for NVIDIA (sm_80), CDNA and RDNA only, not target {tgt.name}"
        )
    given = {
        "k-batch": opts.k_batch if opts.k_batch == "rows" else None,
        "plan-for": opts.plan_for,
        "reduction-innermost": opts.reduction_innermost or None,
        "gemm": opts.gemm,
        "grouped": opts.grouped,
    }
    for name, value in given.items():
        if value is not None:
            raise PlanError(
                f"{name}: {value!r} does not apply to strategy explicit (it takes k-batch and tile options)"
            )
    return policy.plan(problem, tgt, opts)


def explicit_tiling(plan: Plan):  # -> convbw_mlir.policies.sm80.GemmTiling | convbw_mlir.policies.amd.CdnaTiling
    """The kernel tiling an explicit plan's tile stands for (its target family's)."""
    return policies.for_target(plan.target_info).tiling(plan)


def _gpu_strategy(plan: Plan, work: ConvBwdWeightProblem, tgt: Target, opts: Overrides) -> Plan:
    """Strategy and tile of a GPU plan whose GEMM form and split are decided; a split IREE's own tiling
    would pad becomes the largest even batch split it does not pad, else none (automatic), or is refused
    (asked for)."""
    chosen = _gpu_tile(plan, work, tgt, opts)
    why = _iree_split_pads(work, chosen, tgt)
    if why is None:
        return chosen
    if opts.k_batch != "auto":
        raise PlanError(f"k-batch={opts.k_batch}: {why}")
    if plan.split is not None and plan.split.dim == "n":
        n = work.batch
        for k_batch in sorted(_divisors(n, plan.split.k_batch - 1), reverse=True)[:-1]:  # fewer splits, > 1
            smaller = _gpu_tile(replace(plan, split=Split("n", k_batch, n // k_batch)), work, tgt, opts)
            if _iree_split_pads(work, smaller, tgt) is None:
                return smaller
    return _gpu_strategy(replace(plan, split=None), work, tgt, opts)  # unsplit (what else IREE pads: docs#fenced-fuzz)


def _iree_tiles_itself(plan: Plan) -> bool:
    """Whether IREE chooses the plan's tiling: strategy iree, or simt without a thread tile of ours."""
    return plan.strategy == Strategy.IREE or (plan.strategy == Strategy.SIMT and plan.simt is None)


def _iree_split_pads(work: ConvBwdWeightProblem, plan: Plan, tgt: Target) -> str | None:
    """Why ``plan`` (IREE tiling a split itself) would read past x and dy or be wrong, or None: a per-split
    reduction the K of the type's matrix instruction does not divide, or more than :data:`MAX_IREE_SPLITS`
    splits of a problem with one in channel. IREE picks that instruction by the type alone,
    also where :func:`pick_intrinsic` declines, wherever the problem has more than one out channel a group
    (docs/decisions.md#split-iree-step has the measurements)."""
    if not _iree_tiles_itself(plan) or plan.split is None or not tgt.is_gpu:
        return None
    if work.out_channels == 1:  # no M loop for an instruction: every such split stayed inside (docs, as above)
        return None
    intrinsics = tgt.intrinsics.get(work.dtype, ())
    if intrinsics and work.in_channels == 1 and plan.split.k_batch > MAX_IREE_SPLITS:
        return (f"IREE's own tiling of {plan.split.k_batch} splits (over {MAX_IREE_SPLITS}) of a {work.dtype} "
                "problem with one in channel gave wrong dW (docs/decisions.md#split-iree-step)")  # fmt: skip
    contraction = Contraction.build(work, plan.split)
    if not contraction.has_split_loop or not intrinsics or contraction.reduction_extent % intrinsics[0].k == 0:
        return None
    return (f"IREE's own tiling pads the {contraction.reduction_extent} reduction elements of each of "
            f"{plan.split.k_batch} splits (not a multiple of {intrinsics[0].k}); such kernels read past x and dy "
            "(docs/decisions.md#split-iree-step)")  # fmt: skip


def _gpu_tile(plan: Plan, work: ConvBwdWeightProblem, tgt: Target, opts: Overrides) -> Plan:
    """Strategy and tile of a GPU plan whose GEMM form and split are decided (before the IREE split check)."""
    contraction = Contraction.build(work, plan.split)
    policy = tgt.tile_policy
    intr = pick_intrinsic(work, tgt)
    if intr is None or not contraction.has_gemm_dims:
        simt = None
        if contraction.is_rows_split and simt_threads_fit(work):
            simt = choose_simt_tile(work, tgt)
        return _no_tile(replace(plan, strategy=Strategy.SIMT, simt=simt), opts, "too thin for matrix cores")
    try:
        tile = choose_tile(work, tgt, plan.k_batch, intr, **opts.tile)
    except ValueError as e:
        raise PlanError(str(e)) from None
    if contraction.has_split_loop:  # a step that pads a split reads past x and dy: docs/decisions.md#split-gemm-step
        tile = _unpadded_reduction(tile, contraction.reduction_extent, intr)
        if tile is None and contraction.is_convolution and opts.k_batch == "auto":
            return _gpu_strategy(replace(plan, split=None), work, tgt, opts)  # unsplit: padding is safe there
        if tile is None:
            return _no_tile(plan, opts, "a split whose reduction no step divides")
    if not contraction.is_convolution and (opts.gemm or policy.gemm) == "iree":
        return _no_tile(plan, opts, f"a GEMM: IREE's own config on {tgt.name} (option gemm=mma gives ours)")
    if work.groups > 1 and (opts.grouped or policy.grouped) == "iree":
        return _no_tile(plan, opts, f"grouped: IREE's own config on {tgt.name} (option grouped=mma gives ours)")
    if work.layout_family.x[-1] != "C":
        # Our IGEMM tile assumes C innermost in x: docs/decisions.md#channels-first-layouts
        return _no_tile(plan, opts, "channels-first x: IREE's own config")
    return replace(plan, strategy=Strategy.MMA, tile=tile)


def _no_tile(plan: Plan, opts: Overrides, why: str) -> Plan:
    """``plan`` as it is, ``why`` noted for its rule's :class:`Decision`; a tile override would be dropped
    silently, so it is refused instead."""
    if opts.tile:
        name = _spelled(next(n for n in Overrides._TILE if getattr(opts, n) is not None))
        raise PlanError(f"{name}: strategy {plan.strategy.value} takes no tile here ({why})")
    return replace(plan, decision=Decision(_NOTE, "", f"{plan.strategy.value}: {why}"))


def check_plan(problem: ConvBwdWeightProblem, plan: Plan) -> None:
    """Refuse a given plan (a stored or hand-written one) that IREE is known to compile wrongly.

    Raises:
        PlanError: a split whose reduction the tile's step pads, or IREE's own tiling would pad (its
            kernels read past x and dy: docs/decisions.md#split-gemm-step, #split-iree-step), naming the sizes.
    """
    if problem.is_fp8 or sm90_fp8.is_fp8(plan):  # the fp8 GEMM's plan, and only it, computes fp8
        why = [] if problem.is_fp8 else [f"dtype: {problem.dtype} (the plan is the fp8 GEMM's)"]
        why += sm90_fp8.refusals(problem, plan) if sm90_fp8.is_fp8(plan) else ["plan: not the fp8 GEMM's"]
        if why:
            raise PlanError("fp8: " + "; ".join(why))
        return
    problem = computed_problem(problem, plan)
    if plan.strategy == Strategy.EXPLICIT:
        policy = policies.for_target(plan.target_info)
        if plan.gemv is not None:
            why = gemv.refusals(problem, plan)
        elif plan.depthwise is not None:
            why = depthwise.refusals(problem, plan)
            if plan.merge is not None:
                why.append(f"merge: {plan.merge.groups} groups (the depthwise kernel's grouped form takes none)")
        elif policy is None:
            why = ["target: no explicit kernel of ours"]
        else:
            why = policy.refusals(problem, plan)
        if why:
            raise PlanError("strategy explicit: " + "; ".join(why))
        return
    if plan.merge is not None:
        raise PlanError(f"plan: merge: {plan.merge.groups} groups applies to strategy explicit only (strategy: "
                        f"{plan.strategy.value})")  # fmt: skip
    work = effective_problem(problem, plan.reduction_innermost)
    if plan.split is not None:  # a stored plan edited by hand, or for another problem: refused, not compiled
        try:
            check_split(work if plan.gemm else problem, plan.split)
        except ValueError as e:
            raise PlanError(f"plan.split: {e}") from None
    why = _iree_split_pads(work, plan, plan.target_info)
    if why is not None:
        raise PlanError(f"plan: {why}")
    if plan.tile is None or plan.split is None:
        return
    contraction = Contraction.build(work, plan.split)
    if contraction.has_split_loop and contraction.reduction_extent % plan.tile.k:
        raise PlanError(
            f"plan: tile k {plan.tile.k} does not divide the {contraction.reduction_extent} reduction elements of "
            f"each of {plan.split.k_batch} splits; such kernels read past x and dy (docs/decisions.md#split-gemm-step)"
        )


def effective_problem(problem: ConvBwdWeightProblem, reduction_innermost: bool = False) -> ConvBwdWeightProblem:
    """The problem the contraction computes: its GEMM form where :func:`as_gemm` applies (with the
    reduction-innermost layout if asked and possible), else ``problem`` itself."""
    gemm = as_gemm(problem)
    if gemm is None:
        return problem
    if reduction_innermost and gemm.layout_family.x in ("NHWGC", "GNHWC"):
        return gemm.with_(layout=3)  # [N, W, G, C] -> [N, G, C, W]: NGCHW/GKYXC/NGKHW, same dW layout
    return gemm


# Layouts the passes compute in layout 2 (NHWGC/GKYXC/NHWGK: the same dW and D), x and dy transposed
# (convbw-relayout); the group-outermost layout 1 always, layout 3 for convolutions (its 1x1s stay GEMMs).
RELAYOUT = ("GNHWC/GKYXC/GNHWK", "NGCHW/GKYXC/NGKHW")
LAYOUT_2 = "NHWGC/GKYXC/NHWGK"


def relayout(problem: ConvBwdWeightProblem) -> ConvBwdWeightProblem:
    """The problem in the layout the passes compute it in (``convbw-relayout`` transposes x and dy there):
    layout 1 (GNHWC, the group outermost) and layout 3's convolutions (NGCHW) become layout 2 (NHWGC), with
    the same dW and D. IREE 3.13's CUDA codegen read past the end of x or dy at the last group of layout 1 in
    every form, and computed two layout-3 convolutions wrongly in every form (docs/decisions.md#relayout);
    layout 2 is the explicit kernel's and the layout the fenced fuzz found right. A G-less layout is its grouped
    twin first (:meth:`~convbw_mlir.problem.ConvBwdWeightProblem.grouped`: the same bytes, so the same plan)."""
    if not problem.is_fp8:  # the fp8 GEMM reads channels-last x and dy as they lie
        problem = problem.grouped()
    name = problem.layout_family.name
    if name == RELAYOUT[0] or (name == RELAYOUT[1] and as_gemm(problem) is None):
        return problem.with_(layout=LAYOUT_2)
    return problem


LAYOUT_4 = "NGCHW/GKCYX/NGKHW"
# Layout 0 (the group outermost, channels first) takes layout 4's route to layout 2: IREE 3.13's CUDA codegen
# computed a 3-D layout-0 problem wrongly in its own form (fuzz seed 29: fuzz0087) and failed to compile another.
LAYOUT_0 = "GNCHW/GKCYX/GNKHW"
CHANNELS_FIRST = (LAYOUT_4, LAYOUT_0)


def computed_problem(problem: ConvBwdWeightProblem, plan: Plan) -> ConvBwdWeightProblem:
    """The problem a kernel of ``plan`` computes: :func:`relayout`'s, and a layout-4 problem in layout 2 where
    the plan says so (:attr:`Plan.channels_last`; ``convbw-relayout`` transposes x, dy and D there and dW back),
    and its 2-D twin where the plan folds its rank (:attr:`Plan.fold_rank`; reshapes alone).

    Raises:
        PlanError: a channels-last plan for a problem neither in layout 4 nor computed in layout 2; a plan that
            folds the rank of a problem the fold does not take.
    """
    problem = relayout(problem)
    if plan.fold_rank and problem.rank == 2:  # the twin already (convbw-relayout's op), as layout 2 is below
        return problem
    if plan.fold_rank:
        twin, why = fold_rank(problem)
        if twin is None:
            raise PlanError(f"plan.fold_rank: {why}")
        return twin
    if not plan.channels_last or problem.layout == LAYOUT_2:
        return problem
    if problem.layout not in CHANNELS_FIRST:
        raise PlanError(f"plan.channels_last: a problem in layout {problem.layout} (layouts 4, {LAYOUT_4}, and 0, "
                        f"{LAYOUT_0}, only)")  # fmt: skip
    return problem.with_(layout=LAYOUT_2)


def one_tap_window(problem: ConvBwdWeightProblem) -> tuple[tuple[int, int], ...] | None:
    """Per spatial dimension of a 1x1 (filter extent 1 everywhere): (the first output position that reads x,
    how many do); they read x at ``first * stride - pad_low`` onwards, ``stride`` apart. None if some
    filter extent is not 1, or some dimension reads no x at all (dW is then 0: nothing to slice).

    The other output positions read only padding: their dy rows add nothing to dW.
    """
    if any(f != 1 for f in problem.filter_size):
        return None
    window = []
    for size, out, s, lo in zip(problem.input_size, problem.output_size, problem.stride, problem.pad_low):
        first = -(-lo // s)  # the first o with o * s - lo >= 0
        last = min(out - 1, (size - 1 + lo) // s)  # the last o with o * s - lo < size
        if last < first:
            return None
        window.append((first, last - first + 1))
    return tuple(window)


def as_gemm(problem: ConvBwdWeightProblem) -> ConvBwdWeightProblem | None:
    """The equivalent 1-D, stride-1, unpadded problem with the spatial dimensions flattened, or None if not
    a 1x1 (or already that form).

    A 1x1 reads x only at ``o * stride - pad_low``, and only the output positions of :func:`one_tap_window`
    read x inside the image: its GEMM takes those dy rows and that strided window of x. IREE 3.13's CUDA
    codegen was wrong or read past x and dy on padded strided 1x1s in every form it was given
    (docs/decisions.md#padded-1x1); the GEMM of the window has no padding and no stride left.
    """
    window = one_tap_window(problem)
    if window is None:
        return None
    padded = any(problem.pad_low) or any(problem.pad_high)
    if problem.rank == 1 and problem.stride == (1,) and not padded:
        return None  # already the GEMM form
    flat = math.prod(count for _, count in window)
    return problem.with_(input_size=(flat,), filter_size=(1,), stride=1, dilation=1, pad_low=0, pad_high=0)


# -- what a plan costs besides its time: workspace and determinism -------------------------------------
# IREE 3.13 keeps the StreamK dispatch's workspace operand (partials, zeroed flags) a second time, as the
# constant each call's copy starts from, where the partials are at most this size (its const-expr hoisting
# limit); above it only the flags; buffers packed together are aligned to 64 bytes (both measured at IREE's
# stream phase: docs/plan.md#workspace).
STREAMK_HOIST_MAX_BYTES = 1 << 20
ALIGNMENT = 64


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def plan_workspace_bytes(problem: ConvBwdWeightProblem, plan: Plan) -> int:
    """Device memory a kernel of ``plan`` takes beyond x, dy, dW (and D), in bytes (docs/plan.md#workspace):

    * split-K: ``k_batch`` f32 partial sums of dW (stage 1), reduced by stage 2; the depthwise kernel's
      ``chunks`` f32 partials likewise;
    * the sm_90a kernel: its 256-byte maps buffer (the launcher binds its own; IREE's runtime refuses it);
    * StreamK: ``W`` f32 partial tiles ``bm x bn`` and ``W`` i32 flags, and IREE's constant copy of them
      (:data:`STREAMK_HOIST_MAX_BYTES`);
    * codegen (not the explicit kernels, which read the padding by address): the copies of x and dy the
      lowering pads (:func:`convbw_mlir.loops.input_pads`), and of a GEMM form's x where it subsamples a
      strided 1x1;
    * a channels-last plan of a layout-4 problem (:attr:`Plan.channels_last`): the transposed copies of x, dy
      (and D), and an unsplit kernel's dW in layout 2's GKYXC before its transpose back (a split's stage 2
      and the transpose are one dispatch).

    Checked against the transient and constant buffers IREE allocates (its stream phase) for every plan kind
    on host, sm_80 and gfx942 (tests/test_plan_properties.py).
    """
    if sm90_fp8.is_fp8(plan):
        return sm90_fp8.workspace_bytes(problem, plan)
    if plan.fold_rank:  # the 2-D twin's: the same bytes, no copy
        problem = computed_problem(problem, plan)
    total = 0
    if plan.channels_last and relayout(problem).layout in CHANNELS_FIRST:
        copies = [(problem.x_shape, problem.dtype), (problem.dy_shape, problem.dtype)]
        unsplit = plan.split is None and plan.depthwise is None and plan.gemv is None
        if unsplit:  # a stage 2 writes dW transposed (IREE fuses the two)
            copies.append((problem.dw_shape, problem.dw_dtype))
        if problem.epilogue is not None and problem.epilogue.reads_d:
            copies.append((problem.dw_shape, problem.epilogue.d_dtype))
        total += sum(_aligned(math.prod(shape) * DTYPES[dtype]) for shape, dtype in copies)
        problem = problem.with_(layout=LAYOUT_2)
    work = effective_problem(problem, plan.reduction_innermost) if plan.gemm else problem
    elem = DTYPES[problem.dtype]
    if plan.split is not None:
        total += plan.split.k_batch * math.prod(work.shape("acc")) * 4
    if plan.streamk is not None and plan.tile is not None and plan.tile.intrinsic.startswith("NV_WGMMA"):
        from convbw_mlir.policies import sm90

        partials, flags = (_aligned(b) for b in sm90.streamk_workspace(plan))
        total += partials + flags + (partials if partials <= STREAMK_HOIST_MAX_BYTES else 0) + flags
    elif plan.streamk is not None:
        from convbw_mlir.policies.sm80 import gemm_shape

        t, shape = explicit_tiling(plan), gemm_shape(problem)
        tiles = shape.groups * math.ceil(shape.m / t.bm) * math.ceil(shape.n / t.bn)
        workgroups = max(1, min(plan.streamk.workgroups, tiles * math.ceil(shape.reduction / t.bk)))
        partials, flags = _aligned(workgroups * t.bm * t.bn * 4), _aligned(workgroups * 4)
        total += partials + flags + (partials if partials <= STREAMK_HOIST_MAX_BYTES else 0) + flags
    if plan.depthwise is not None:  # each row chunk's f32 partial dW, summed by the second stage
        total += plan.depthwise.chunks * math.prod(problem.shape("acc")) * 4
    if plan.gemv is not None and plan.gemv.chunks > 1:  # likewise each position chunk's (one: dW itself)
        total += plan.gemv.chunks * math.prod(problem.shape("acc")) * 4
    if plan.strategy == Strategy.EXPLICIT:
        from convbw_mlir.policies import sm90

        return total + (sm90.MAPS_BYTES if sm90.is_sm90(plan) else 0)  # the maps' region of the transient
    if plan.gemm and any(s > 1 for s in problem.stride):  # the GEMM's x: every stride-th position (a transpose fuses)
        total += math.prod(work.x_shape) * elem
    pads = input_pads(work, plan.split)
    if any(pads.x_low) or any(pads.x_high):
        total += math.prod(pads.x_shape(work)) * elem
    if any(pads.dy_high):
        total += math.prod(pads.dy_shape(work)) * elem
    return total


def plan_is_deterministic(plan: Plan) -> bool:
    """Whether a kernel of ``plan`` writes bitwise the same dW run after run: every plan of ours sums in a
    fixed order. Split-K's stage 1 writes each partial sum to its own slot and stage 2 adds them in split
    order (no atomics); StreamK's finisher adds its contributors' partials in workgroup order, linear or
    by a fixed binomial tree (the atomics are its flags, never sums); a SIMT thread and an MMA tile reduce
    serially; IREE's own codegen uses no atomics without its opt-in split reduction (docs/plan.md#determinism;
    bench/determinism.py checks it on the GPU). A plan that summed with atomics would answer False here."""
    return True


def plan_properties(problem: ConvBwdWeightProblem, plan: Plan) -> Plan:
    """``plan`` with its :attr:`~Plan.workspace_bytes` and :attr:`~Plan.deterministic` for ``problem``."""
    return replace(plan, workspace_bytes=plan_workspace_bytes(problem, plan), deterministic=plan_is_deterministic(plan))


def satisfies(plan: Plan, deterministic: bool = False, max_workspace_bytes: int | None = None) -> bool:
    """Whether ``plan`` (its properties filled) meets a user's requests: bitwise reproducible where
    ``deterministic``, at most ``max_workspace_bytes`` of workspace where given."""
    if deterministic and not plan.deterministic:
        return False
    return max_workspace_bytes is None or (
        plan.workspace_bytes is not None and plan.workspace_bytes <= max_workspace_bytes
    )


# -- split-K ------------------------------------------------------------------------------------------
# Rows split: partials at most this fraction of the input bytes: docs/decisions.md#rows-split
MAX_ROWS_PARTIAL_FRACTION = 0.1
# A SIMT thread holds C * taps f32 accumulators, at most this many in registers: docs/decisions.md#rows-split
MAX_THREAD_ACCUMULATORS = 64
# Each split keeps at least this many reduction elements: docs/decisions.md#split-minimum
MIN_SPLIT_REDUCTION = 512
# IREE's own tiling of a matrix-instruction type with one in channel: at most this many splits (32 gave
# wrong dW, 16 and fewer did not): docs/decisions.md#split-iree-step
MAX_IREE_SPLITS = 16
# Thin 1x1 problems split at most this often (IREE's kernels were wrong beyond): docs/decisions.md#thin-gemm-splits
MAX_THIN_GEMM_SPLITS = 2


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (1 always among them)."""
    return [d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0]


def plan_rows_split(problem: ConvBwdWeightProblem) -> Split | None:
    """Each image's each first-output-row its own partial sum: loops ``n`` and ``o0`` made parallel.

    For the SIMT strategy: with these loops parallel, a thread owns one (image, row, channel) and all
    filter taps, and reads channels-last x and dy along the channel, coalesced. None for a 1-D problem
    (nothing would be left to reduce in a partial) or fewer than 2 partials.
    """
    if problem.rank < 2:
        return None
    count = problem.batch * problem.output_size[0]
    return Split("n,o0", count, 1) if count > 1 else None


def rows_split_pays(problem: ConvBwdWeightProblem, split: Split) -> bool:
    """Whether the rows split's partial sums are small against the inputs (:data:`MAX_ROWS_PARTIAL_FRACTION`)."""
    partial_bytes = split.k_batch * math.prod(problem.shape("acc")) * 4
    input_bytes = (math.prod(problem.x_shape) + math.prod(problem.dy_shape)) * DTYPES[problem.dtype]
    return partial_bytes <= MAX_ROWS_PARTIAL_FRACTION * input_bytes


def uses_matrix_cores(problem: ConvBwdWeightProblem, target: Target) -> bool:
    """Whether the target has an intrinsic for the problem and both GEMM dimensions are real loops."""
    return pick_intrinsic(problem, target) is not None and problem.out_channels > 1 and problem.in_channels > 1


def plan_split_k(problem: ConvBwdWeightProblem, target: Target, k_batch: int | str) -> Split | None:
    """The split for ``k_batch``: ``rows`` (:func:`plan_rows_split`), a number of batch splits
    (:func:`plan_split`), or ``auto``: on a GPU the rows split for problems too thin for matrix cores
    whose threads hold a dW row and whose partials pay, else the even batch split of :func:`auto_k_batch`.

    Raises:
        PlanError: a number of splits the batch's whole images cannot make (naming it and the nearest that work).
    """
    if k_batch == "rows":
        return plan_rows_split(problem)
    if k_batch != "auto":  # asked for: carried out as asked or refused, never replaced by another count
        split = plan_split(problem, k_batch)
        got, n = (split.k_batch if split else 1), problem.batch
        if got != k_batch:
            fits = lambda k: math.ceil(n / math.ceil(n / k)) == k  # noqa: E731
            below = next(k for k in range(min(k_batch, n), 0, -1) if fits(k))
            above = next((k for k in range(k_batch + 1, n + 1) if fits(k)), None)
            near = " or ".join(str(k) for k in (below, above) if k is not None)
            raise PlanError(f"k-batch: {k_batch} (a batch of {n} in splits of whole images is {got} "
                            f"split{'s' * (got != 1)}, not {k_batch}; the nearest that work: {near})")  # fmt: skip
        return split
    if target.is_gpu and not uses_matrix_cores(problem, target) and simt_threads_fit(problem):
        rows = plan_rows_split(problem)
        if rows is not None and rows_split_pays(problem, rows):
            return rows
    return plan_split(problem, auto_k_batch(problem, target), even=True)


def plan_split(problem: ConvBwdWeightProblem, k_batch: int, even: bool = False) -> Split | None:
    """Split the reduction into (at most) ``k_batch`` chunks of the batch; None when nothing is split.

    Only the batch loop is split: its chunks read whole images and IREE still sees a convolution. (An
    output-row split is valid linalg and the lowering builds it for ``split_dim = "o<i>"``, but IREE
    3.13 crashes compiling it: docs/decisions.md#no-row-chunks.) A batch shorter than ``k_batch``
    yields fewer chunks, never empty ones (5 images in 3 -> 3 chunks of 2, the last padded with a zero
    image). ``even`` takes the largest divisor of N instead (docs/decisions.md#even-splits).

    Raises:
        PlanError: ``k_batch`` below 1.
    """
    if not _is_int(k_batch) or k_batch < 1:
        raise PlanError(f"k-batch: expected a positive integer, got {k_batch!r}")
    n = problem.batch
    if k_batch == 1 or n == 1:
        return None
    if even:  # the largest divisor of N not above k_batch: no padded images
        k_batch = max(_divisors(n, k_batch))
        if k_batch == 1:
            return None
    chunk = math.ceil(n / k_batch)
    kb = math.ceil(n / chunk)
    return Split("n", kb, chunk) if kb > 1 else None


def auto_k_batch(problem: ConvBwdWeightProblem, target: Target) -> int:
    """How many splits of the reduction, by strategy (docs/decisions.md#auto-k-batch):

    * matrix-core convolutions (G=1): CK's occupancy rule (split_k_utils.hpp,
      get_best_occupancy_k_batch_value): k_batch = floor(CUs * occupancy / grid), clamped to [1, 128]
      and so that each split keeps :data:`MIN_SPLIT_REDUCTION` reduction elements;
    * thin groups and depthwise (SIMT): as many splits as the batch allows (up to 128);
    * 1x1 problems too thin for matrix cores: at most :data:`MAX_THIN_GEMM_SPLITS`;
    * grouped convolutions with matrix cores (G>1): 1.

    On the host (no CU model) it is 1.
    """
    if not target.compute_units:
        return 1
    intr = pick_intrinsic(problem, target)
    if intr is None and math.prod(problem.filter_size) == 1:
        return min(problem.batch, MAX_THIN_GEMM_SPLITS)
    if intr is None:
        return min(problem.batch, 128)
    if problem.groups > 1:
        return 1
    tile = choose_tile(problem, target, intrinsic=intr)  # the grid before N is narrowed for the split
    k_batch = (target.compute_units * OCCUPANCY) // max(_grid(problem, tile.m, tile.n), 1)
    k_batch = min(k_batch, 128, problem.gemm[3] // MIN_SPLIT_REDUCTION)
    return max(1, k_batch)


# -- MMA tiles ----------------------------------------------------------------------------------------
# Below these a group's GEMM wastes over half of a 16-wide intrinsic: docs/decisions.md#strategy-choice
MIN_MMA_M = 8
MIN_MMA_N = 16
# Resident workgroups per CU the occupancy model assumes: docs/decisions.md#narrow-n
OCCUPANCY = 2
# N tiles are halved down to this while the split grid leaves CUs idle: docs/decisions.md#narrow-n
MIN_OCCUPANCY_TILE_N = 64


def pick_intrinsic(problem: ConvBwdWeightProblem, target: Target) -> Intrinsic | None:
    """The target's preferred matrix instruction for the problem's input type, or None (no MMA)."""
    options = target.intrinsics.get(problem.dtype, ())
    if not options:
        return None
    if problem.out_channels < MIN_MMA_M or problem.in_channels * math.prod(problem.filter_size) < MIN_MMA_N:
        return None
    return options[0]


def _pow2_at_least(v: int, lo: int, hi: int) -> int:
    p = lo
    while p < v and p < hi:
        p *= 2
    return p


def choose_tile(
    problem: ConvBwdWeightProblem,
    target: Target,
    k_batch: int | None = None,
    intrinsic: Intrinsic | None = None,
    **overrides: int,
) -> Tile:
    """Workgroup tile, reduction step, subgroup layout and prefetch depth for ``problem`` on ``target``.

    M tiles the out channels and N the in channels (the filter channel is innermost, so it is the loop
    the N side of the instruction walks); each filter tap is its own tile. Tiles are powers of two from
    one intrinsic up to 128, so that a small K or C (36, 3) pads to the next power of two, not to 128.
    Four waves per workgroup; the reduction step keeps (m + n) * k * bytes within half the LDS, at most
    64. With ``k_batch`` (the split already planned), N is halved down to :data:`MIN_OCCUPANCY_TILE_N`
    while ``grid * k_batch`` stays below ``OCCUPANCY`` workgroups a CU, where the target's tile policy
    says so; a policy's accumulator cap halves M instead. ``overrides`` (m, n, k, subgroups_m,
    subgroups_n, stages) replace any choice; ``intrinsic`` defaults to :func:`pick_intrinsic`'s.

    Raises:
        ValueError: no intrinsic for the problem, or a tile the intrinsic or the LDS cannot take.
    """
    intr = intrinsic or pick_intrinsic(problem, target)
    if intr is None:
        raise ValueError(f"tile: {target.name} has no matrix instruction for {problem.name} ({problem.dtype})")
    policy = target.tile_policy
    m = _pow2_at_least(problem.out_channels, intr.m, 128)
    n = _pow2_at_least(problem.in_channels, intr.n, 128)
    while (
        k_batch is not None
        and policy.narrow_n
        and "n" not in overrides
        and n // 2 >= max(MIN_OCCUPANCY_TILE_N, 2 * intr.n)
        and _grid(problem, m, n) * k_batch < target.compute_units * OCCUPANCY
    ):
        n //= 2
    m, n = overrides.get("m", m), overrides.get("n", n)
    # Four waves where the tile has room for them: 2 x 2, else along the longer side.
    sg_m = 2 if m >= 2 * intr.m else 1
    sg_n = 2 if n >= 2 * intr.n else 1
    if sg_m * sg_n < 4 and m >= 4 * intr.m and sg_n == 1:
        sg_m = 4
    elif sg_m * sg_n < 4 and n >= 4 * intr.n and sg_m == 1:
        sg_n = 4
    sg_m, sg_n = overrides.get("subgroups_m", sg_m), overrides.get("subgroups_n", sg_n)
    # At most the policy's f32 accumulators a lane (docs/decisions.md#rdna-accumulators), halving M.
    cap = dict(policy.acc_per_lane).get(problem.dtype)
    while (
        cap is not None
        and "m" not in overrides
        and m > intr.m * sg_m
        and m * n // (sg_m * sg_n * target.subgroup_size) > cap
    ):
        m //= 2
    elem = DTYPES[problem.dtype]
    k = 64
    while k > intr.k and (m + n) * k * elem > target.lds_bytes // 2:
        k //= 2
    k = max(intr.k, overrides.get("k", k))
    tile = Tile(m, n, k, sg_m, sg_n, overrides.get("stages", 2), intr.name)
    _check_tile(tile, intr, target, elem)
    return tile


def _grid(problem: ConvBwdWeightProblem, m: int, n: int) -> int:
    """Workgroups of one split: groups x M tiles x N tiles x filter taps."""
    taps = math.prod(problem.filter_size)
    return problem.groups * math.ceil(problem.out_channels / m) * math.ceil(problem.in_channels / n) * taps


def _check_tile(tile: Tile, intr: Intrinsic, target: Target, elem: int) -> None:
    for name, size, sg, unit in (("m", tile.m, tile.subgroups_m, intr.m), ("n", tile.n, tile.subgroups_n, intr.n)):
        if size % (sg * unit):
            raise ValueError(f"tile-{name}: {size} is not a multiple of {sg} subgroups x {unit} ({intr.name})")
    if tile.k % intr.k:
        raise ValueError(f"tile-k: {tile.k} is not a multiple of the intrinsic's K {intr.k} ({intr.name})")
    lds = (tile.m + tile.n) * tile.k * elem
    if lds > target.lds_bytes:
        raise ValueError(
            f"tile: ({tile.m} + {tile.n}) x {tile.k} x {elem} B = {lds} B exceeds LDS {target.lds_bytes} B"
        )


def _unpadded_reduction(tile: Tile, reduction: int, intr: Intrinsic) -> Tile | None:
    """The tile with a reduction step that divides a split's reduction, or None if none does: IREE's
    kernels for a split whose reduction our step pads were wrong (GEMMs) or read past the end of x and
    dy (convolutions): docs/decisions.md#split-gemm-step."""
    k = tile.k
    while k >= intr.k and reduction % k:
        k //= 2
    return replace(tile, k=k) if k >= intr.k else None


# -- SIMT ---------------------------------------------------------------------------------------------
def simt_threads_fit(problem: ConvBwdWeightProblem) -> bool:
    """Whether a SIMT thread can hold all in channels x taps of its dW row (see :class:`SimtTile`)."""
    return problem.in_channels * math.prod(problem.filter_size) <= MAX_THREAD_ACCUMULATORS


def choose_simt_tile(problem: ConvBwdWeightProblem, target: Target) -> SimtTile:
    """Threads along the channels (out channels innermost, then groups: the innermost dimensions of
    channels-last dy and x, so a subgroup's loads are contiguous), then output rows, up to four
    subgroups per workgroup. Every size divides its loop (no partial tiles, no padding);
    docs/decisions.md#simt-tile."""
    budget = 4 * target.subgroup_size
    channels = max(_divisors(problem.out_channels, budget))
    # Whole subgroups first (G=144: 16 groups x 8 rows = 128 threads, not 72 x 1), then more threads,
    # then more groups (wider contiguous loads).
    candidates = [
        SimtTile(rows, groups, channels)
        for groups in _divisors(problem.groups, budget // channels)
        for rows in _divisors(problem.output_size[0], budget // (channels * groups))
    ]
    return max(candidates, key=lambda t: (t.threads % target.subgroup_size == 0, t.threads, t.groups))
