"""The policy of our sm_80 depthwise kernel (``convbw_mlir/kernels/depthwise_sm80.py``): which problems it
takes, its numbers and their rule, its refusals (pure Python: the plan asks it once).

A depthwise weight gradient (one in and one out channel a group, channels-last: layout 2, NHWGC/GKYXC/NHWGK)
has no GEMM to give matrix cores: per channel g and tap t it is the dot product
``dW[g, t] = sum_(n, o) dy[n, o, g] * x[n, o * s + t * d - p, g]`` over the batch and every output position.
The kernel reads both operands along the channels (V channels, up to 16 bytes, a thread), keeps a window of
x vectors in registers along the innermost spatial dimension and reuses each for the taps that read it; a
thread owns a channel vector, one tap of the outer filter dimensions and a run of ``taps`` inner taps, and
a lane of rows; a workgroup owns ``channels`` channels and a chunk of the rows (image, outer output
coordinates, segment of the innermost one). Its lanes' sums meet in shared memory (in order), the chunks'
in an f32 workspace ``[chunks, G, 1, taps]`` that a second stage sums (in order) and rounds to dW's type:
no atomics, the same bits every run.

Thin groups (at most :data:`MAX_GROUP_CHANNELS` in and out channels a group) take the same kernel in its
grouped form: a thread's vector runs along a group's in channels (``dW[g, k, t, c]``) and dy's one value of
its out channel k is broadcast over it; a workgroup owns ``channels / C`` whole groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from convbw_mlir.plan_data import DepthwisePlan, Overrides, Plan, PlanError, Strategy
from convbw_mlir.policies import switches
from convbw_mlir.policies.sm80 import ConvGeometry, is_channels_last
from convbw_mlir.targets import Target

__all__ = ["DepthwiseKernel", "is_depthwise", "kernel", "plan", "refusals", "takes",
           "takes_by_default"]  # fmt: skip


DTYPES = ("f16", "bf16")
VECTOR = 8  # channels a thread reads at once: 16 bytes of f16 (a divisor of G where 8 is not)
MAX_CHANNELS = 64  # channels a workgroup: 8 threads' 16-byte loads make one 128-byte line
MAX_GROUP_CHANNELS = 16  # in and out channels a group of the grouped form ("thin groups", issue 23)
MAX_INNER_TAPS = 4  # inner taps a thread: 4 x 8 f32 accumulators, the x window 4 + 3 + 3 vectors at unroll 4
UNROLL = 4  # output positions of the innermost dimension a step of the thread's loop
THREADS = 256  # threads a workgroup the rule aims at (rows lanes fill up to it)
MAX_THREADS = 1024
MAX_ACCUMULATORS = 64  # f32 accumulators a thread (taps x vector)
SEGMENT = 64  # the innermost output dimension is cut into segments of this many (long 1-D signals)
MIN_SEGMENT = 16  # segments are halved down to this while the rows cannot fill the grid
# Workgroups an SM the rule aims at (rows split into chunks until the grid has that many): 2, not 8 (issue 40,
# H100: fewer, longer-lived workgroups; docs/decisions.md#depthwise-hopper)
WAVES = 2
# The wide form the rule gives depthwise problems: 4 channels a thread, a run of up to 8 inner taps, steps of 8
# outputs (fewer conversions and loads an FMA; against the narrow form: docs/decisions.md#depthwise-by-default).
WIDE_VECTOR, WIDE_TAPS, WIDE_UNROLL = 4, 8, 8
# x vectors a step of the wide form may hold (its window): a stride-2 step of 8 outputs and 3-5 taps (17-19) halves
# its outputs (measured faster: docs/decisions.md#depthwise-hopper)
MAX_WINDOW = 16
# Workgroups an SM the rule aims at where the window halves the wide step (measured: docs/decisions.md#depthwise-hopper)
HALVED_WAVES = 4
# The chunks' partial sums are added by the kernel's own stage 2 (depthwise_sm80.build_sum_body), not by IREE's
# reduction (a serial chain of loads a thread, its time growing with the chunks).
OWN_STAGE2 = True
# The input types converted to f32 by an identity mma.sync (two vectors of 4 a pair) instead of cvt.f32.f16 (16 a
# clock an SM, the f16 kernel's bound) or bf16's shifts: exact; the workgroup is rounded up to whole warps (every
# lane of a warp runs the mma).
MMA_CONVERT: tuple[str, ...] = ("f16", "bf16")
# ... in threads that run at least this many steps (issue-bound; shorter ones are bound by latency, where the mma's
# set-up and the warp rounding cost more than the conversions: round 2 on the H100, docs/decisions.md#depthwise-hopper)
MMA_MIN_STEPS = 32
# A step's loads issued one step ahead (the raw vectors carried through the loop): latency hidden by the thread
# itself, at the registers of one more step's vectors.
PREFETCH = False


def is_depthwise(problem: Any) -> bool:
    """One in channel and one out channel a group (any number of groups)."""
    return problem.in_channels == 1 and problem.out_channels == 1


def is_thin(problem: Any) -> bool:
    """Depthwise, or groups of at most :data:`MAX_GROUP_CHANNELS` in and out channels (the grouped form)."""
    return max(problem.in_channels, problem.out_channels) <= MAX_GROUP_CHANNELS


@dataclass(frozen=True)
class DepthwiseKernel:
    """The kernel's numbers, derived once from the problem and the plan (the builder takes this).

    Threads of a workgroup, fastest first: channel vector (``lanes_c``), inner tap run (``runs``), outer tap
    (``outer_taps``), row lane (``lanes_r``). A row is (image, outer output coordinates, segment). Depthwise
    (``paired``): a vector is ``vector`` groups, x's and dy's alike; grouped: ``lanes_c`` runs over the
    group's in-channel vectors, then its out channels, then the workgroup's groups.
    """

    conv: ConvGeometry
    images: int
    groups: int
    vector: int
    channels: int
    taps: int  # inner taps a thread (a run)
    lanes_r: int
    chunks: int
    segment: int
    unroll: int = UNROLL
    in_channels: int = 1  # a group's (C)
    out_channels: int = 1  # a group's (K)
    mma_convert: bool = False  # f16 -> f32 by identity mma.sync (see kernel())
    prefetch: bool = False  # each step reads the next one's vectors before its FMAs (see kernel())

    @property
    def paired(self) -> bool:
        """Depthwise: x's and dy's channels are the same (one a group), read as one vector each."""
        return self.in_channels == 1 and self.out_channels == 1

    @property
    def group_tile(self) -> int:
        """Groups a workgroup."""
        return self.channels // self.in_channels

    @property
    def lanes_c(self) -> int:
        if self.paired:
            return self.channels // self.vector
        return self.group_tile * self.out_channels * (self.in_channels // self.vector)

    @property
    def inner(self) -> int:
        """The filter's innermost size (taps along the innermost spatial dimension)."""
        return self.conv.filter[-1]

    @property
    def runs(self) -> int:
        return -(-self.inner // self.taps)

    @property
    def outer_taps(self) -> int:
        return math.prod(self.conv.filter[:-1])

    @property
    def threads(self) -> int:
        return self.lanes_c * self.runs * self.outer_taps * self.lanes_r

    @property
    def launched(self) -> int:
        """Threads a workgroup as launched: :attr:`threads`, rounded up to whole warps where the f16 conversion
        runs on the tensor cores (every lane of a warp takes part in an ``mma.sync``; the added threads own no
        rows)."""
        return -(-self.threads // 32) * 32 if self.mma_convert else self.threads

    @property
    def segments(self) -> int:
        return -(-self.conv.out_size[-1] // self.segment)

    @property
    def rows(self) -> int:
        """Rows of the reduction: images x outer output positions x segments."""
        return self.images * math.prod(self.conv.out_size[:-1]) * self.segments

    @property
    def chunk_rows(self) -> int:
        return -(-self.rows // self.chunks)

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.groups * self.in_channels // self.channels, self.chunks, 1

    @property
    def offsets(self) -> list[int]:
        """Offsets along the innermost dimension of the x vectors one step reads, from its first position
        (``wo0 * s - p + run * taps * d``): ``u * s + t * d`` for each of the step's outputs and the run's taps."""
        s, d = self.conv.stride[-1], self.conv.dilation[-1]
        return sorted({u * s + t * d for u in range(self.unroll) for t in range(self.taps)})

    @property
    def reach(self) -> int:
        """The last x position any step reads along the innermost dimension (past the image: masked)."""
        conv = self.conv
        s, d, p = conv.stride[-1], conv.dilation[-1], conv.pad[-1]
        return (self.segments * self.segment - 1) * s + (self.runs * self.taps - 1) * d - p

    @property
    def shared_bytes(self) -> int:
        """The lanes' sums in shared memory: ``lanes_r x channels x taps a workgroup`` f32."""
        per_lane = self.lanes_c * self.runs * self.outer_taps
        return -(-self.launched // per_lane) * per_lane * self.taps * self.vector * 4

    def problems(self) -> list[str]:
        """Why the kernel cannot run with these numbers ("field: value" lines); empty if it can."""
        why = []
        span, what = (self.groups, "groups") if self.paired else (self.in_channels, "in channels a group")
        if self.vector not in (1, 2, 4, 8) or span % self.vector:
            why.append(f"depthwise.vector: {self.vector} (1, 2, 4 or 8 channels that divide the {span} {what})")
        whole = self.vector if self.paired else self.in_channels
        if self.channels % whole or (self.groups * self.in_channels) % self.channels:
            why.append(f"depthwise.channels: {self.channels} (a multiple of the "
                       f"{'vector' if self.paired else 'group'} that divides the {self.groups} groups)")  # fmt: skip
        if self.taps * self.vector > MAX_ACCUMULATORS:
            why.append(f"depthwise.taps: {self.taps} x {self.vector} channels = {self.taps * self.vector} "
                       f"accumulators a thread, over {MAX_ACCUMULATORS}")  # fmt: skip
        if self.segment % self.unroll:
            why.append(f"depthwise.segment: {self.segment} (a multiple of the unroll, {self.unroll})")
        if self.chunks > self.rows:
            why.append(f"depthwise.chunks: {self.chunks} (at most the {self.rows} rows)")
        if not why and self.launched > MAX_THREADS:
            why.append(f"depthwise: {self.launched} threads a workgroup, over {MAX_THREADS} (fewer channels or "
                       "row lanes)")  # fmt: skip
        return why


def takes(problem: Any) -> list[str]:
    """Why the depthwise kernel cannot compute ``problem`` at all ("field: value" lines); empty if it can."""
    why = []
    if not is_thin(problem):
        why.append(f"in_channels: {problem.in_channels}, out_channels: {problem.out_channels} a group (the "
                   f"depthwise kernel takes one of each, or thin groups of at most {MAX_GROUP_CHANNELS})")  # fmt: skip
    if not is_channels_last(problem):
        why.append(f"layout: {problem.layout} (the depthwise kernel takes layout 2, NHWGC/GKYXC/NHWGK)")
    if problem.dtype not in DTYPES:
        why.append(f"dtype: {problem.dtype} ({' or '.join(DTYPES)})")
    elif problem.dw_dtype not in ("f32", problem.dtype):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (none in the depthwise kernel)")
    return why


def takes_by_default(problem: Any, target: Target) -> bool:
    """Whether the plan chooses this kernel by itself: the switch
    :data:`~convbw_mlir.policies.switches.DEPTHWISE_BY_DEFAULT` is on, the target is NVIDIA's and the kernel
    takes the problem, a depthwise one or groups of at most
    :data:`~convbw_mlir.policies.switches.GROUPED_BY_DEFAULT` in and out channels (where the grouped form was
    measured faster than the implicit GEMM and SIMT)."""
    from convbw_mlir.policies import sm80

    # groups the implicit GEMM merges into one matrix tile go there (1.9x this form at 4 channels a group)
    narrow = is_depthwise(problem) or (
        max(problem.in_channels, problem.out_channels) <= switches.GROUPED_BY_DEFAULT
        and not (switches.MERGE_BY_DEFAULT and sm80.merge_rule(problem, target) > 1)
    )
    return switches.DEPTHWISE_BY_DEFAULT and target.family == "nvidia" and narrow and not takes(problem)


def _geometry(problem: Any) -> ConvGeometry:
    return ConvGeometry(problem.input_size, problem.output_size, problem.filter_size, problem.stride,
                        problem.dilation, problem.pad_low)  # fmt: skip


def _rule(problem: Any, tgt: Target, wide: bool = True) -> DepthwisePlan:
    """The kernel's numbers by rule: the widest channel vector that divides G, up to 64 channels a
    workgroup, runs of at most :data:`MAX_INNER_TAPS` taps, row lanes up to :data:`THREADS` threads, and
    rows cut into chunks of a whole number of rows a lane until the grid has :data:`WAVES` workgroups an SM
    (long innermost dimensions cut into segments first, halved while the rows are too few for that); for a
    depthwise problem its wide form (:func:`_wide`) where the kernel takes it, unless not ``wide``."""
    g, c, k = problem.groups, problem.in_channels, problem.out_channels
    inner = problem.filter_size[-1]
    taps = -(-inner // -(-inner // MAX_INNER_TAPS))
    runs_outer = -(-inner // taps) * math.prod(problem.filter_size[:-1])
    if c == 1 and k == 1:  # the vector runs over groups
        vector = next(v for v in (VECTOR, 4, 2, 1) if g % v == 0)
        # large filters own many threads a channel vector already: fewer channels keep a workgroup in THREADS
        lanes_c = max(d for d in range(1, MAX_CHANNELS // vector + 1)
                      if (g // vector) % d == 0 and (d * runs_outer <= THREADS or d == 1))  # fmt: skip
        channels = vector * lanes_c
    else:  # over a group's in channels; whole groups a workgroup, up to THREADS threads a row lane
        vector = next(v for v in (VECTOR, 4, 2, 1) if c % v == 0)
        per_group = k * (c // vector) * runs_outer
        tile = max(d for d in range(1, g + 1) if g % d == 0 and (d * per_group <= THREADS or d == 1))
        lanes_c, channels = tile * k * (c // vector), tile * c
    base = lanes_c * runs_outer
    lanes_r = 1
    while base * lanes_r * 2 <= THREADS:
        lanes_r *= 2
    wo = problem.output_size[-1]
    segment = -(-wo // UNROLL) * UNROLL if wo <= 2 * SEGMENT else SEGMENT
    waves = HALVED_WAVES if wide and c == 1 and k == 1 and _wide_unroll(problem) < WIDE_UNROLL else WAVES
    want = -(-waves * max(tgt.compute_units, 1) // (g * c // channels))  # chunks that fill the grid

    def numbers(segment: int) -> DepthwiseKernel:
        return DepthwiseKernel(_geometry(problem), problem.batch, g, vector, channels, taps, lanes_r, 1, segment,
                               UNROLL, c, k)  # fmt: skip

    while segment >= 2 * MIN_SEGMENT and numbers(segment).rows < want * lanes_r:
        segment = -(-segment // (2 * UNROLL)) * UNROLL
    rows = numbers(segment).rows
    chunk_rows = lanes_r * -(-rows // (lanes_r * want))  # a whole number of rows a lane
    narrow = DepthwisePlan(vector, channels, taps, lanes_r, -(-rows // chunk_rows), segment, UNROLL)
    if wide and c == 1 and k == 1:
        return _wide(problem, tgt, narrow) or narrow
    return narrow


def _wide_unroll(problem: Any) -> int:
    """Outputs a step of the wide form: :data:`WIDE_UNROLL`, halved where the x window the step holds in registers,
    ``(unroll - 1) * stride + (taps - 1) * dilation + 1`` vectors, would pass :data:`MAX_WINDOW`."""
    inner = problem.filter_size[-1]
    taps = -(-inner // -(-inner // WIDE_TAPS))
    s, d = problem.stride[-1], problem.dilation[-1]
    return next((u for u in (WIDE_UNROLL, WIDE_UNROLL // 2) if (u - 1) * s + (taps - 1) * d + 1 <= MAX_WINDOW),
                WIDE_UNROLL // 2)  # fmt: skip


def _wide(problem: Any, tgt: Target, narrow: DepthwisePlan) -> DepthwisePlan | None:
    """The wide form of the narrow numbers (the same channels, row lanes and chunks; :data:`WIDE_VECTOR`
    channels a thread, runs of up to :data:`WIDE_TAPS` taps, steps of :data:`WIDE_UNROLL`), or None where the
    kernel cannot carry it out (a vector that does not divide the channels, too many threads or shared bytes)."""
    inner = problem.filter_size[-1]
    taps = -(-inner // -(-inner // WIDE_TAPS))
    unroll = _wide_unroll(problem)
    segment = -(-narrow.segment // unroll) * unroll
    wide = DepthwisePlan(min(WIDE_VECTOR, narrow.vector), narrow.channels, taps, narrow.rows, narrow.chunks, segment,
                         unroll)  # fmt: skip
    k = kernel(problem, wide)
    return None if k.problems() or k.shared_bytes > tgt.lds_bytes else wide


def kernel(problem: Any, dw: DepthwisePlan) -> DepthwiseKernel:
    """The kernel's numbers for ``problem`` carried out as ``dw`` says; the inputs converted by the tensor cores
    (types in :data:`MMA_CONVERT`) where the kernel can: depthwise, 4 channels a vector (its threads then whole
    warps)."""
    k = DepthwiseKernel(_geometry(problem), problem.batch, problem.groups, dw.vector, dw.channels, dw.taps,
                        dw.rows, dw.chunks, dw.segment, dw.unroll, problem.in_channels,
                        problem.out_channels)  # fmt: skip
    steps = -(-k.chunk_rows // k.lanes_r) * (k.segment // k.unroll)  # a thread's, at most
    if problem.dtype in MMA_CONVERT and k.paired and k.vector == 4 and steps >= MMA_MIN_STEPS:
        k = replace(k, mma_convert=True)
    return replace(k, prefetch=PREFETCH)


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """The depthwise plan: the rule's numbers (:func:`_rule`); no tile, split or StreamK options apply.

    Raises:
        PlanError: an option the kernel does not take, or a problem it cannot compute (every reason).
    """
    opts.refuse_for(
        "the depthwise kernel", (*Overrides._TILE, "streamk", "producers"), "it splits the rows into chunks by its rule"
    )
    why = takes(problem)
    if why:
        raise PlanError("strategy explicit (depthwise): " + "; ".join(why))
    chosen = Plan(tgt.name, Strategy.EXPLICIT, depthwise=_rule(problem, tgt))
    why = refusals(problem, chosen)
    if why:
        raise PlanError("strategy explicit (depthwise): " + "; ".join(why))
    return chosen


def refusals(problem: Any, plan: Plan) -> list[str]:
    """Why this kernel cannot carry ``plan`` out ("field: value" lines; empty: it can)."""
    why = takes(problem)
    if plan.target_info.family != "nvidia":
        why.append(f"target: {plan.target} (the depthwise kernel is written for sm_80 only)")
    why += plan.fields_given(("tile", "split", "simt", "streamk", "wavespec"), "the depthwise kernel")
    if not why:
        k = kernel(problem, plan.depthwise)
        why += k.problems()
        cap = plan.target_info.lds_bytes
        if not why and k.shared_bytes > cap:
            why.append(f"depthwise: {k.shared_bytes} B of shared memory, over {cap}")
    return why
