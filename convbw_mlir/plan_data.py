"""What a plan is: the frozen :class:`Plan` and its parts (split, tile, SIMT tile, StreamK, wave
specialization), their plain data (:meth:`Plan.to_dict`, :meth:`Plan.from_dict`), and the options a user or a
tuner may give (:class:`Overrides`). Data only: :mod:`convbw_mlir.plan` decides, the kernel policies
(:mod:`convbw_mlir.policies`) answer for their kernels, the passes carry a plan out.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from convbw_mlir.loops import Split
from convbw_mlir.targets import Target, get_target

__all__ = [
    "LAYOUT4_FORMS",
    "STRATEGY_OPTIONS",
    "Decision",
    "DepthwisePlan",
    "GemvPlan",
    "MergePlan",
    "STREAMK_FIXUPS",
    "WAVESPEC_PRODUCERS",
    "WGMMA_ROWS",
    "WGMMA_STAGES_MIN",
    "Overrides",
    "Plan",
    "PlanError",
    "SimtTile",
    "StreamKPlan",
    "Strategy",
    "Tile",
    "WaveSpecPlan",
]


# The largest integer an option or a plan field takes: the IR holds them as integer attributes (a value past
# int64 was a std::bad_cast inside MLIR), and 2**31 - 1 is far past any real tile, stage, split or grid size.
MAX_INT = 2**31 - 1


class PlanError(ValueError):
    """An override the plan cannot take; the message names the option and its value."""


class Strategy(enum.StrEnum):
    """How the contraction is computed (see the module docstring)."""

    MMA = "mma"
    SIMT = "simt"
    IREE = "iree"
    EXPLICIT = "explicit"


@dataclass(frozen=True)
class Tile:
    """A workgroup's work, in elements: an ``m`` (out channels) by ``n`` (in channels) tile of one
    group and filter tap, ``k`` reduction elements per step, ``subgroups_m x subgroups_n`` waves,
    ``stages`` of prefetch, and ``intrinsic``, the matrix instruction (IREE's name)."""

    m: int
    n: int
    k: int
    subgroups_m: int
    subgroups_n: int
    stages: int
    intrinsic: str

    @property
    def subgroups(self) -> int:
        return self.subgroups_m * self.subgroups_n


@dataclass(frozen=True)
class SimtTile:
    """The SIMT strategy's workgroup over a rows split: ``rows`` output rows x ``groups`` groups x
    ``channels`` out channels, one thread each; a thread owns all filter taps and in channels of its
    (image, row, group, out channel) and reduces the rest of the row serially."""

    rows: int
    groups: int
    channels: int

    @property
    def threads(self) -> int:
        return self.rows * self.groups * self.channels


@dataclass(frozen=True)
class StreamKPlan:
    """StreamK (strategy explicit): ``workgroups`` persistent workgroups share all tiles' k iterations;
    ``fixup`` (``linear`` or ``tree``) combines a tile's partials (convbw_mlir/kernels/streamk_sm80.py)."""

    workgroups: int
    fixup: str = "linear"


STREAMK_FIXUPS = ("linear", "tree")
WAVESPEC_PRODUCERS = (2, 4)  # CK's wavelet ratios with 4 consumer warps: 4:2 and 4:4


@dataclass(frozen=True)
class WaveSpecPlan:
    """Wave specialization (strategy explicit, sm_80, layout 2): ``producers`` warps copy global -> shared,
    the tiling's warps compute, split by named barriers (convbw_mlir/kernels/wavespec_sm80.py)."""

    producers: int


@dataclass(frozen=True)
class DepthwisePlan:
    """The depthwise kernel's numbers (strategy explicit, sm_80, layout 2; convbw_mlir/kernels/depthwise_sm80.py):
    ``vector`` channels a thread's load, ``channels`` a workgroup, ``taps`` inner filter taps a thread, ``rows``
    row lanes a workgroup, ``chunks`` workgroups along the rows (each writes an f32 partial), ``segment``
    outputs of the innermost dimension a row, ``unroll`` of them a step of a thread's loop."""

    vector: int
    channels: int
    taps: int
    rows: int
    chunks: int
    segment: int
    unroll: int = 4


@dataclass(frozen=True)
class GemvPlan:
    """The split-reduction GEMV kernel's numbers (strategy explicit, NVIDIA, layout 2; K or C small:
    convbw_mlir/kernels/gemv_sm80.py): ``k_block`` out and ``c_block`` in channels a thread, ``taps`` filter taps a
    thread (a run), ``lanes`` position lanes a workgroup, ``chunks`` workgroups along the positions (each writes
    an f32 partial dW, summed in chunk order by the second stage; one chunk writes dW itself), ``unroll``
    positions a step of a lane's loop (their loads issued together), ``interior``: an iteration whose positions
    read inside x skips the padding checks (a branch; off by rule: slower on every padded problem measured)."""

    k_block: int
    c_block: int
    taps: int
    lanes: int
    chunks: int
    unroll: int = 1
    interior: bool = False


@dataclass(frozen=True)
class MergePlan:
    """Group merging (strategy explicit, sm_80, layout 2; convbw_mlir/policies/sm80.py "Merged groups"): ``groups``
    consecutive groups share one implicit GEMM, whose store keeps only the block-diagonal entries;
    ``skip_off_diagonal``: a warp skips the ``mma.sync`` tiles that meet no diagonal block (off by default: the
    whole dense GEMM was faster on all six layers measured, docs/decisions.md#thin-groups)."""

    groups: int
    skip_off_diagonal: bool = False


@dataclass(frozen=True)
class Decision:
    """Why a plan is what it is: the rule of :data:`convbw_mlir.plan.RULES` that made it, or where it came from
    (``tuned``: a tuning database's entry; ``nearest``, ``learned``, ``constrained``: what ``select`` chose it by,
    ``then`` the rule that made it). Not part of the plan's identity (:attr:`Plan.decision`).

    Attributes:
        rule: the rule's name.
        reason: the rule's one-line reason (the same for every problem it applies to).
        detail: what the rule found for this problem (which kernel, a refusal that made an earlier rule decline).
        options: the overrides the plan was decided with ((name, value) pairs; empty: none, the plan's own choice).
        then: the decision of the problem a rule decided again in another form (a layout-4 problem in layout 2).
    """

    rule: str
    reason: str
    detail: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    then: Decision | None = None

    def __str__(self) -> str:
        text = f"{self.rule} ({self.reason})"
        if self.detail:
            text += f"; {self.detail}"
        if self.options:
            text += "; options " + ", ".join(f"{k}={v}" for k, v in self.options)
        return text + (f" -> {self.then}" if self.then is not None else "")

    def lines(self) -> list[str]:
        """``rule: a -> b``, then a ``why:`` line a rule (reason; what it found) and the ``options:`` line."""
        chain = [self]
        while chain[-1].then is not None:
            chain.append(chain[-1].then)
        out = ["rule: " + " -> ".join(d.rule for d in chain)]
        out += [f"why: {d.rule}: {d.reason}" + (f"; {d.detail}" if d.detail else "") for d in chain]
        options = ", ".join(f"{k}={v}" for k, v in self.options) or "none (the plan's own choice)"
        return out + [f"options: {options}"]

    def __repr__(self) -> str:
        return f"<{self.rule}{' -> ' + self.then.rule if self.then is not None else ''}: {self.reason}>"


@dataclass(frozen=True)
class Plan:
    """How one problem is computed on one target. Frozen and hashable: a tuner's unit.

    Attributes:
        target: the target name.
        strategy: mma, simt or iree.
        gemm: carried out as a batched GEMM (an unpadded 1x1: ``convbw-explicit-gemm``).
        reduction_innermost: the GEMM's channels-last x and dy transposed so the reduction is innermost.
        split: the split-K of the reduction, or None.
        tile: the matrix-core tile (strategy mma).
        simt: the thread tile (strategy simt over a rows split).
        streamk: StreamK's persistent grid and fixup (strategy explicit on NVIDIA), or None: no StreamK.
        wavespec: producer warps of a wave-specialized explicit kernel, or None: every warp copies and computes.
        depthwise: the depthwise kernel's numbers (strategy explicit), or None: not the depthwise kernel.
        gemv: the split-reduction GEMV kernel's numbers (strategy explicit), or None: not that kernel.
        channels_last: a layout-4 (NGCHW/GKCYX/NGKHW) problem computed as layout 2 (NHWGC/GKYXC/NHWGK) by the
            channels-last kernels: x and dy transposed before the kernel, dW after (``convbw-relayout``).
        folded: layout 4's explicit kernel without a gather (strategy explicit, sm_80): x's windows by
            ``cp.async``, each tap's shift applied in shared memory (``gemm_sm80.build_folded_kernel_body``).
        merge: groups merged into one implicit GEMM (strategy explicit, thin groups), or None: one group a GEMM.
        fold_rank: a 3-D problem computed as its 2-D twin by reshapes (:func:`convbw_mlir.problem.fold_rank`;
            ``convbw-relayout``); the rest of the plan is the 2-D problem's.
        workspace_bytes: device memory the kernel takes beyond x, dy, dW and D (split-K partials, StreamK
            partials and flags, IREE's padded copies of x and dy): :func:`convbw_mlir.plan.plan_properties`.
        deterministic: whether dW is bitwise the same run after run (every sum in a fixed order).
        decision: the rule that made the plan and its reason (:class:`Decision`; :func:`convbw_mlir.plan.decide`
            fills it, ``select`` for a database's entry), None on a plan read from its plain data.

    ``workspace_bytes`` and ``deterministic`` are properties of the plan for its problem, not choices:
    :func:`convbw_mlir.plan.decide`, :func:`convbw_mlir.plan.plan_properties`, ``compile_op`` and
    ``CompiledOp.load`` fill them; ``decision`` is its history. None of the three is part of the plan's identity
    (equality, hash, :meth:`to_dict`: cache keys and tuning databases), and each is None on a plan read from its
    plain data alone (no problem to size them by, no rule that made it).
    """

    target: str
    strategy: Strategy
    gemm: bool = False
    reduction_innermost: bool = False
    split: Split | None = None
    tile: Tile | None = None
    simt: SimtTile | None = None
    streamk: StreamKPlan | None = None
    wavespec: WaveSpecPlan | None = None
    depthwise: DepthwisePlan | None = None
    gemv: GemvPlan | None = None
    channels_last: bool = False
    folded: bool = False
    merge: MergePlan | None = None
    fold_rank: bool = False
    workspace_bytes: int | None = field(default=None, compare=False, repr=False)
    deterministic: bool | None = field(default=None, compare=False, repr=False)
    decision: Decision | None = field(default=None, compare=False)

    @property
    def target_info(self) -> Target:
        return get_target(self.target)

    @property
    def k_batch(self) -> int:
        return self.split.k_batch if self.split else 1

    def fields_given(self, names: Iterable[str], kernel: str) -> list[str]:
        """ "field: value" lines for each of ``names`` this plan sets, which ``kernel`` takes none of."""
        return [
            f"{name}: {getattr(self, name)} ({kernel} takes none)" for name in names if getattr(self, name) is not None
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON and the IR attribute): entries that are None or False are left out."""
        data: dict[str, Any] = {"target": self.target, "strategy": self.strategy.value, "gemm": self.gemm}
        if self.reduction_innermost:
            data["reduction_innermost"] = True
        for name, _ in _PARTS:
            part = getattr(self, name)
            if part is not None:
                data[name] = {f.name: getattr(part, f.name) for f in fields(part)}
        if self.channels_last:
            data["channels_last"] = True
        if self.folded:
            data["folded"] = True
        if self.fold_rank:
            data["fold_rank"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The inverse of :meth:`to_dict`.

        Raises:
            PlanError: a malformed plan (unknown entry, strategy or target, a tile missing a field).
        """
        if not isinstance(data, dict):
            raise PlanError(f"plan: expected a dictionary, got {data!r}")
        known = {
            "target",
            "strategy",
            "gemm",
            "reduction_innermost",
            "channels_last",
            "folded",
            "fold_rank",
            *(name for name, _ in _PARTS),
        }
        unknown = set(data) - known
        if unknown:
            raise PlanError(f"plan: unknown entries {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        for name in ("target", "strategy"):
            if name not in data:
                raise PlanError(f"plan: missing entry {name!r}")
        for name in ("gemm", "reduction_innermost", "channels_last", "folded", "fold_rank"):
            if not isinstance(data.get(name, False), bool):
                raise PlanError(f"plan.{name}: expected true or false, got {data[name]!r}")
        try:
            get_target(data["target"])
        except ValueError as e:
            raise PlanError(f"plan.target: {e}") from None
        if data["strategy"] not in set(Strategy):
            known_strategies = ", ".join(s.value for s in Strategy)
            raise PlanError(f"plan.strategy: expected one of {known_strategies}, got {data['strategy']!r}")
        parts = {name: _part(name, kind, data[name]) for name, kind in _PARTS if data.get(name) is not None}
        return cls(data["target"], Strategy(data["strategy"]), data.get("gemm", False),
                   data.get("reduction_innermost", False), **parts,
                   channels_last=data.get("channels_last", False), folded=data.get("folded", False),
                   fold_rank=data.get("fold_rank", False))  # fmt: skip


def _part(name: str, kind: type, data: Any) -> Any:
    """One optional part of a plan from its plain data: every field present and of its type (integers >= 1).

    Raises:
        PlanError: naming the part, the field and the value.
    """
    if not isinstance(data, dict):
        raise PlanError(f"plan.{name}: expected a dictionary, got {data!r}")
    spec = {f.name: f for f in fields(kind)}
    unknown = set(data) - set(spec)
    if unknown:
        raise PlanError(f"plan.{name}: unknown entries {', '.join(sorted(unknown))}; known: {', '.join(spec)}")
    for field_name, f in spec.items():
        where = f"plan.{name}.{field_name}"
        if field_name not in data:
            if f.default is MISSING:
                raise PlanError(f"{where}: missing")
            continue
        value = data[field_name]
        if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PlanError(f"{where}: expected an integer >= 1, got {value!r}")
        if f.type == "int":
            _at_most(where, value)
        if f.type == "bool" and not isinstance(value, bool):
            raise PlanError(f"{where}: expected true or false, got {value!r}")
        if f.type == "str" and not (isinstance(value, str) and value):
            raise PlanError(f"{where}: expected a non-empty string, got {value!r}")
    if kind is StreamKPlan and data.get("fixup", "linear") not in STREAMK_FIXUPS:
        raise PlanError(f"plan.streamk.fixup: expected one of {', '.join(STREAMK_FIXUPS)}, got {data['fixup']!r}")
    try:
        return kind(**data)
    except (TypeError, ValueError) as e:  # the part's own checks (e.g. a rows split's chunk)
        raise PlanError(f"plan.{name}: {e}") from None


# A plan's optional parts: its field name and type, in the order its plain data lists them.
_PARTS = (
    ("split", Split),
    ("tile", Tile),
    ("simt", SimtTile),
    ("streamk", StreamKPlan),
    ("wavespec", WaveSpecPlan),
    ("depthwise", DepthwisePlan),
    ("merge", MergePlan),
    ("gemv", GemvPlan),
)


# -- the options a user (or a tuner) may give ---------------------------------------------------------
# ``strategy`` as an option: the explicit kernel, IREE's codegen configured by the plan, or the split-reduction
# GEMV kernel (an explicit kernel for K or C small: convbw_mlir/policies/gemv.py).
STRATEGY_OPTIONS = (Strategy.EXPLICIT.value, "codegen", "gemv")
# ``layout4`` as an option: a layout-4 problem's explicit kernel on NVIDIA in layout 2 between transposes
# (``relayout``), the layout-4 kernel that gathers x (``gather``), or the one that folds x's taps in shared memory
# (``fold``).
LAYOUT4_FORMS = ("relayout", "gather", "fold")
# The sm_90a wgmma kernel's tile rows (Overrides.wgmma_rows): one or two consumer warpgroups of 64 rows
WGMMA_ROWS = (64, 128)
# The wgmma kernel's shallowest ring (Overrides.wgmma_stages): one stage loading while one is read
WGMMA_STAGES_MIN = 2


@dataclass(frozen=True)
class Overrides:
    """Choices that replace the plan's own (pipeline spelling: ``k-batch``, ``tile-m`` ...).

    Attributes:
        k_batch: ``auto``, ``rows`` (one partial per image and output row) or a number of batch splits.
        plan_for: the target whose facts size the split (default: the target itself).
        tile_m, tile_n, tile_k: the MMA workgroup tile and reduction step, in elements.
        subgroups_m, subgroups_n: waves / warps along M and N.
        stages: prefetch stages (IREE's ``prefetch_num_stages``).
        gemm, grouped: ``mma`` (our tile) or ``iree`` (IREE's own) for plain GEMMs and grouped
            convolutions; None takes the target's tile policy.
        reduction_innermost: transpose a channels-last GEMM's x and dy so the reduction is innermost.
        strategy: ``explicit`` asks for the kernel our passes write (docs/explicit-kernels.md),
            ``codegen`` for a plan IREE's codegen carries out (mma, simt or iree: the plan picks), ``gemv``
            for the split-reduction GEMV kernel (:mod:`convbw_mlir.policies.gemv`); None lets the plan choose:
            explicit where it wins (:func:`_explicit_wins`), else codegen.
        streamk: StreamK's persistent workgroups for strategy explicit: ``auto`` (the target's SMs) or a
            number; None (the default): no StreamK.
        streamk_fixup: how StreamK combines a tile's partials: ``linear`` (the default) or ``tree``.
        producers: wave specialization for strategy explicit: 2 or 4 producer warps beside the tiling's
            (consumer) warps; None (the default): none.
        layout4: a layout-4 problem's form on NVIDIA: ``relayout`` (the channels-last kernels between
            transposes, :attr:`Plan.channels_last`), ``gather`` (the layout-4 explicit kernel, or codegen),
            ``fold`` (the layout-4 explicit kernel without a gather, :attr:`Plan.folded`; asked for only);
            None: the plan's choice (relayout where the channels-last problem's plan is one of our kernels;
            with ``strategy`` given, layout 4's own forms).
        merge_groups: groups one implicit GEMM of strategy explicit computes (thin groups, layout 2): 1 keeps one
            group a GEMM; None (the default): the kernel policy's rule (:func:`convbw_mlir.policies.sm80.merge_rule`).
        wgmma_merge: on sm_90a, strategy explicit: the wgmma kernel's boxed form for groups of C < 64 channels, this
            many groups a 64-channel box (1 for C of 33-63; :func:`convbw_mlir.policies.sm90.merge_for` gives the
            most); None (the default): the policy's rule (:func:`convbw_mlir.policies.sm90.merge_rule`, behind its
            switch, off), else the sm_80 kernel.
        fold_rank: a 3-D problem as its 2-D twin by reshapes (:func:`convbw_mlir.problem.fold_rank`): True asks
            for it (refused by name where it does not apply), False never; None (the default): the plan's rule
            (switch ``FOLD_RANK_BY_DEFAULT``, off).
        wgmma_rows: on sm_90a, strategy explicit: the wgmma kernel's tile rows, 64 (one consumer warpgroup) or 128
            (two); None (the default): the policy's (:func:`convbw_mlir.policies.sm90.consumers_for`: 64 where
            K <= 64, else 128). Not ``tile-m``, which asks for the sm_80 kernel there.
        wgmma_pad_channels: on sm_90a, strategy explicit: True asks for the wgmma kernel on in-channels C a
            multiple of 8 but not of 64, each tap's channels padded to whole 64-channel boxes
            (:mod:`convbw_mlir.kernels.conv_sm90`); False (the default): such C get the sm_80 kernel.
        wgmma_stages: on sm_90a, strategy explicit: the wgmma kernel's ring of shared-memory stages (k tiles of 64
            in flight), 2 up to what the tile's ring fits in the target's shared memory a workgroup
            (:func:`convbw_mlir.policies.sm90.max_stages`); None (the default): 4. Not ``stages``, which asks
            for the sm_80 kernel there.
    """

    k_batch: int | str = "auto"
    plan_for: str | None = None
    tile_m: int | None = None
    tile_n: int | None = None
    tile_k: int | None = None
    subgroups_m: int | None = None
    subgroups_n: int | None = None
    stages: int | None = None
    gemm: str | None = None
    grouped: str | None = None
    reduction_innermost: bool = False
    strategy: str | None = None
    streamk: int | str | None = None
    streamk_fixup: str | None = None
    producers: int | None = None
    layout4: str | None = None
    merge_groups: int | None = None
    wgmma_merge: int | None = None
    fold_rank: bool | None = None
    wgmma_rows: int | None = None
    wgmma_pad_channels: bool = False
    wgmma_stages: int | None = None

    _TILE = ("tile_m", "tile_n", "tile_k", "subgroups_m", "subgroups_n", "stages")

    def __post_init__(self) -> None:
        for name in ("k_batch", *self._TILE, "wgmma_rows", "wgmma_stages"):  # numpy integers are integers too
            value = getattr(self, name)
            if not isinstance(value, int | str | None) and _integral(value):
                object.__setattr__(self, name, int(value))
        kb = self.k_batch
        if not (kb in ("auto", "rows") or (_is_int(kb) and kb >= 1)):
            raise PlanError(f"k-batch: expected auto, rows or a positive integer, got {kb!r}")
        for name in ("k_batch", *self._TILE, "streamk", "merge_groups", "wgmma_merge", "wgmma_stages"):
            _at_most(_spelled(name), getattr(self, name))
        if self.plan_for is not None:
            _target(self.plan_for, "plan-for")
        for name in self._TILE:
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 1):
                raise PlanError(f"{_spelled(name)}: expected a positive integer, got {value!r}")
        for name in ("gemm", "grouped"):
            value = getattr(self, name)
            if value not in (None, "mma", "iree"):
                raise PlanError(f"{name}: expected mma or iree, got {value!r}")
        if self.strategy not in (None, *STRATEGY_OPTIONS):
            choices = "explicit or codegen (or none: the plan's choice)"
            raise PlanError(f"strategy: expected {choices}, got {self.strategy!r}")
        if not (self.streamk in (None, "auto") or (_is_int(self.streamk) and self.streamk >= 1)):
            raise PlanError(f"streamk: expected auto or a positive number of workgroups, got {self.streamk!r}")
        if self.streamk is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"streamk: {self.streamk!r} applies to strategy explicit only (strategy: {chosen})")
        if self.streamk_fixup not in (None, *STREAMK_FIXUPS):
            raise PlanError(f"streamk-fixup: expected linear or tree, got {self.streamk_fixup!r}")
        if self.streamk_fixup is not None and self.streamk is None:
            raise PlanError(f"streamk-fixup: {self.streamk_fixup} needs streamk (a number of workgroups or auto)")
        if self.producers is not None and not (_is_int(self.producers) and self.producers in WAVESPEC_PRODUCERS):
            raise PlanError(f"producers: expected 2 or 4 producer warps, got {self.producers!r}")
        if self.producers is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"producers: {self.producers} applies to strategy explicit only (strategy: {chosen})")
        if self.layout4 not in (None, *LAYOUT4_FORMS):
            raise PlanError(f"layout4: expected relayout, gather or fold, got {self.layout4!r}")
        if self.merge_groups is not None and not (_is_int(self.merge_groups) and self.merge_groups >= 1):
            raise PlanError(f"merge-groups: expected a positive integer, got {self.merge_groups!r}")
        if self.merge_groups is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"merge-groups: {self.merge_groups} applies to strategy explicit only (strategy: {chosen})")
        if self.wgmma_merge is not None and not (_is_int(self.wgmma_merge) and self.wgmma_merge >= 1):
            raise PlanError(f"wgmma-merge: expected a positive integer, got {self.wgmma_merge!r}")
        if self.wgmma_merge is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"wgmma-merge: {self.wgmma_merge} applies to strategy explicit only (strategy: {chosen})")
        if self.wgmma_rows is not None and not (_is_int(self.wgmma_rows) and self.wgmma_rows in WGMMA_ROWS):
            raise PlanError(f"wgmma-rows: expected 64 or 128, got {self.wgmma_rows!r}")
        if self.wgmma_rows is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"wgmma-rows: {self.wgmma_rows} applies to strategy explicit only (strategy: {chosen})")
        stages = self.wgmma_stages
        if stages is not None and not (_is_int(stages) and stages >= WGMMA_STAGES_MIN):
            raise PlanError(f"wgmma-stages: expected an integer of at least {WGMMA_STAGES_MIN}, got {stages!r}")
        if stages is not None and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"wgmma-stages: {stages} applies to strategy explicit only (strategy: {chosen})")
        if not isinstance(self.wgmma_pad_channels, bool):
            raise PlanError(f"wgmma-pad-channels: expected true or false, got {self.wgmma_pad_channels!r}")
        if self.wgmma_pad_channels and self.strategy != Strategy.EXPLICIT.value:
            chosen = self.strategy or "none, the plan's choice"
            raise PlanError(f"wgmma-pad-channels: true applies to strategy explicit only (strategy: {chosen})")
        if self.fold_rank is not None and not isinstance(self.fold_rank, bool):
            raise PlanError(f"fold-rank: expected true or false, got {self.fold_rank!r}")
        if not isinstance(self.reduction_innermost, bool):
            raise PlanError(f"reduction-innermost: expected true or false, got {self.reduction_innermost!r}")

    def refuse_for(self, kernel: str, names: Iterable[str], split: str) -> None:
        """Refuse the first of ``names`` given, or a k-batch other than auto: ``kernel`` takes its numbers from its
        own rule (``split``: how it splits the reduction).

        Raises:
            PlanError: naming the option and its value.
        """
        for name in names:
            if getattr(self, name) is not None:
                raise PlanError(f"{name.replace('_', '-')}: {getattr(self, name)!r} does not apply to {kernel} "
                                "(its numbers are its rule's)")  # fmt: skip
        if self.k_batch != "auto":
            raise PlanError(f"k-batch: {self.k_batch!r} does not apply to {kernel} ({split})")

    @property
    def tile(self) -> dict[str, int]:
        """The tile overrides given, by :class:`Tile` field (``m``, ``n``, ``k``, ``subgroups_m`` ...)."""
        key = {"tile_m": "m", "tile_n": "n", "tile_k": "k"}
        return {key.get(n, n): getattr(self, n) for n in self._TILE if getattr(self, n) is not None}


def _at_most(name: str, value: Any) -> None:
    """Refuse an integer past :data:`MAX_INT` (naming ``name``); anything else is checked by the caller."""
    if _is_int(value) and value > MAX_INT:
        raise PlanError(f"{name}: {value} is past {MAX_INT} (2**31 - 1), the largest a plan takes")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integral(value: Any) -> bool:
    """A non-bool integer of another library (numpy's), which ``operator.index`` accepts."""
    if type(value).__name__.startswith("bool"):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _spelled(name: str) -> str:
    return name.replace("_", "-")


def _target(name: Target | str, option: str) -> Target:
    if isinstance(name, Target):  # resolved once at the top of a compile
        return name
    try:
        return get_target(name)
    except ValueError as e:
        raise PlanError(f"{option}: {str(e).removeprefix('target: ')}") from None
