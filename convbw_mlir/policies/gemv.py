"""The policy of the split-reduction GEMV kernel (``convbw_mlir/kernels/gemv_sm80.py``): which problems it takes,
its numbers and their rule, its refusals (pure Python: the plan asks it once).

A weight gradient whose out or in channels are few (K or C small, down to 1: a single-channel first layer, a
one-output probe, CK's tiny test cases) is a GEMV-like contraction: ``dW[g, k, t, c] = sum over positions p of
dy[p, g, k] * x[window(p, t), g, c]`` with a long reduction over the images and output positions and few outputs.
Matrix cores have no tile to fill there and IREE's SIMT codegen reduces one output a thread serially (50-100 us
floors, 1.75 ms on CK's 3-D case). This kernel spreads the reduction over the whole GPU instead: a thread owns
``k_block`` out channels (one vector load of dy), ``c_block`` in channels (vector loads of x along the contiguous
channels) and a run of ``taps`` filter taps, and walks a lane of the positions of its workgroup's chunk, ``unroll``
positions a step; the lanes' sums meet in shared memory (a fixed binary tree), the chunks' in an f32 workspace
``[chunks, G, K, taps * C]`` that a second stage sums in chunk order and rounds to dW's type (one chunk: the kernel
writes dW itself, no second dispatch): no atomics, the same bits every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from convbw_mlir.plan_data import GemvPlan, Overrides, Plan, PlanError, Strategy
from convbw_mlir.policies import switches
from convbw_mlir.policies.sm80 import ConvGeometry, is_channels_last
from convbw_mlir.targets import Target

__all__ = ["GemvKernel", "is_gemv_like", "kernel", "plan", "refusals", "rule", "takes", "takes_by_default"]

DTYPES = ("f16", "bf16")
MAX_BLOCK = 8  # out or in channels a thread: one 16-byte load of f16
MAX_NARROW = 8  # K or C at most this: GEMV-like (the other side may be wide)
MAX_GROUPS = 4  # groups at most, by default: many narrow groups are the depthwise kernel's and the merged GEMM's
MAX_ACCUMULATORS = 64  # f32 accumulators a thread (k_block x c_block x taps), as the depthwise kernel's cap
THREADS = 256  # threads a workgroup the rule aims at (position lanes fill up to it)
MAX_THREADS = 1024
WAVES = 2  # workgroups an SM the chunks aim at
MIN_STEPS = 8  # positions a lane walks at least in a chunk (fewer: the lanes' reduction dominates)
UNROLL = 4  # positions a step of a lane's loop: their loads in flight together (memory-level parallelism)
# The interior branch (unchecked taps where a whole iteration reads inside x): slower on every padded problem of the
# H100 run that had it, 1.2-2.8x (bench/results/h100_2026-12-06_gemv_round2/): off by rule, a stored plan's option.
INTERIOR = False
WORKSPACE_SHARE = 2  # partials at most 1/2 of x's and dy's bytes (the second stage reads them), beyond one a SM


def is_gemv_like(problem: Any) -> bool:
    """K or C at most :data:`MAX_NARROW` a group, in at most :data:`MAX_GROUPS` groups."""
    return min(problem.in_channels, problem.out_channels) <= MAX_NARROW and problem.groups <= MAX_GROUPS


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _vector(n: int) -> int:
    """The widest load (8, 4, 2 or 1 elements) that divides ``n``."""
    return next(v for v in (8, 4, 2, 1) if n % v == 0)


@dataclass(frozen=True, kw_only=True)
class GemvKernel(GemvPlan):
    """The plan's numbers with the problem's, derived once (the builder takes this).

    Threads of a workgroup, fastest first: out-channel block (``k_blocks``), in-channel block (``c_blocks``), tap
    run (``runs``), group, position lane (``lanes``). A thread owns ``k_block x c_block x taps`` accumulators,
    f32 vectors of ``c_vector`` in channels; it reads dy ``k_vector`` and x ``c_vector`` channels a load.
    """

    conv: ConvGeometry
    images: int
    groups: int
    in_channels: int
    out_channels: int

    @property
    def k_vector(self) -> int:
        return _vector(self.k_block)

    @property
    def c_vector(self) -> int:
        return _vector(self.c_block)

    @property
    def k_blocks(self) -> int:
        return self.out_channels // self.k_block

    @property
    def c_blocks(self) -> int:
        return self.in_channels // self.c_block

    @property
    def filter_taps(self) -> int:
        return self.conv.taps

    @property
    def runs(self) -> int:
        return -(-self.filter_taps // self.taps)

    @property
    def slots(self) -> int:
        """Threads that share a position: every (group, out block, in block, tap run)."""
        return self.groups * self.k_blocks * self.c_blocks * self.runs

    @property
    def threads(self) -> int:
        return self.slots * self.lanes

    @property
    def accumulators(self) -> int:
        return self.k_block * self.c_block * self.taps

    @property
    def positions(self) -> int:
        """The reduction: images x output positions."""
        return self.images * math.prod(self.conv.out_size)

    @property
    def chunk_positions(self) -> int:
        return -(-self.positions // self.chunks)

    @property
    def steps(self) -> int:
        """Positions a lane walks in its chunk (the last may be masked)."""
        return -(-self.chunk_positions // self.lanes)

    @property
    def loop_steps(self) -> int:
        """Iterations of a lane's loop, ``unroll`` positions each."""
        return -(-self.steps // self.unroll)

    @property
    def direct(self) -> bool:
        """One chunk: the kernel writes dW itself (no workspace, no second stage)."""
        return self.chunks == 1

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.chunks, 1, 1

    @property
    def shared_bytes(self) -> int:
        """The lanes' sums in shared memory: every thread's accumulators, f32."""
        return self.threads * self.accumulators * 4

    def problems(self) -> list[str]:
        """Why the kernel cannot run with these numbers ("field: value" lines); empty if it can."""
        why = []
        if self.out_channels % self.k_block or self.k_block > MAX_BLOCK:
            why.append(f"gemv.k_block: {self.k_block} (a divisor of the {self.out_channels} out channels a group, "
                       f"at most {MAX_BLOCK})")  # fmt: skip
        if self.in_channels % self.c_block or self.c_block > MAX_BLOCK:
            why.append(f"gemv.c_block: {self.c_block} (a divisor of the {self.in_channels} in channels a group, "
                       f"at most {MAX_BLOCK})")  # fmt: skip
        if self.taps > self.filter_taps:
            why.append(f"gemv.taps: {self.taps} (at most the filter's {self.filter_taps})")
        if not why and self.accumulators > MAX_ACCUMULATORS:
            why.append(f"gemv: {self.k_block} x {self.c_block} channels x {self.taps} taps = {self.accumulators} "
                       f"accumulators a thread, over {MAX_ACCUMULATORS}")  # fmt: skip
        if self.chunks > self.positions:
            why.append(f"gemv.chunks: {self.chunks} (at most the {self.positions} positions)")
        if self.unroll > 8:
            why.append(f"gemv.unroll: {self.unroll} (at most 8 positions a step)")
        if self.lanes & (self.lanes - 1):
            why.append(f"gemv.lanes: {self.lanes} (a power of 2: the lanes' sums fold as a binary tree)")
        if not why and self.threads > MAX_THREADS:
            why.append(f"gemv: {self.threads} threads a workgroup ({self.slots} slots x {self.lanes} lanes), over "
                       f"{MAX_THREADS}")  # fmt: skip
        return why


def takes(problem: Any) -> list[str]:
    """Why the GEMV kernel cannot compute ``problem`` at all ("field: value" lines); empty if it can."""
    why = []
    if not is_channels_last(problem):
        why.append(f"layout: {problem.layout} (the GEMV kernel takes layout 2, NHWGC/GKYXC/NHWGK)")
    if problem.dtype not in DTYPES:
        why.append(f"dtype: {problem.dtype} ({' or '.join(DTYPES)})")
    elif problem.dw_dtype not in ("f32", problem.dtype):
        why.append(f"dw_dtype: {problem.dw_dtype} (f32 or {problem.dtype}, the input type)")
    if problem.epilogue is not None:
        why.append(f"epilogue: {problem.epilogue.kind} (none in the GEMV kernel)")
    return why


def _geometry(problem: Any) -> ConvGeometry:
    return ConvGeometry(problem.input_size, problem.output_size, problem.filter_size, problem.stride,
                        problem.dilation, problem.pad_low)  # fmt: skip


def rule(problem: Any, tgt: Target) -> GemvPlan:
    """The kernel's numbers by rule: the widest channel blocks (divisors of K and C up to :data:`MAX_BLOCK`),
    runs of taps up to :data:`MAX_ACCUMULATORS` accumulators, position lanes up to :data:`THREADS` threads, and
    the positions cut into chunks until the grid has :data:`WAVES` workgroups an SM, each lane walking at least
    :data:`MIN_STEPS` positions, the partials at most ``1 /`` :data:`WORKSPACE_SHARE` of x's and dy's bytes."""
    k_block = _divisor_at_most(problem.out_channels, MAX_BLOCK)
    c_block = _divisor_at_most(problem.in_channels, MAX_BLOCK)
    taps_all = math.prod(problem.filter_size)
    per_tap = k_block * c_block
    taps = max(1, min(taps_all, MAX_ACCUMULATORS // per_tap))
    taps = -(-taps_all // -(-taps_all // taps))  # runs of equal length
    slots = problem.groups * (problem.out_channels // k_block) * (problem.in_channels // c_block) * (
        -(-taps_all // taps))  # fmt: skip
    lanes = 1
    while slots * lanes * 2 <= THREADS:
        lanes *= 2
    positions = problem.batch * math.prod(problem.output_size)
    by_work = max(1, positions // (lanes * MIN_STEPS))
    acc_bytes = problem.groups * problem.out_channels * problem.in_channels * taps_all * 4
    io_bytes = (math.prod(problem.x_shape) + math.prod(problem.dy_shape)) * 2
    sms = max(tgt.compute_units, 1)
    by_workspace = max(sms, io_bytes // (WORKSPACE_SHARE * acc_bytes))
    chunks = max(1, min(WAVES * sms, by_work, by_workspace, positions))
    chunks = -(-positions // -(-positions // chunks))  # no empty chunk
    steps = -(-positions // (chunks * lanes))
    unroll = next(u for u in (UNROLL, 2, 1) if steps >= 2 * u or u == 1)
    return GemvPlan(k_block, c_block, taps, lanes, chunks, unroll, INTERIOR)


def kernel(problem: Any, gemv: GemvPlan) -> GemvKernel:
    """The kernel's numbers for ``problem`` carried out as ``gemv`` says."""
    return GemvKernel(**vars(gemv), conv=_geometry(problem), images=problem.batch, groups=problem.groups,
                      in_channels=problem.in_channels, out_channels=problem.out_channels)  # fmt: skip


def takes_by_default(problem: Any, tgt: Target, codegen: Plan) -> bool:
    """Whether the plan chooses this kernel by itself: the switch
    :data:`~convbw_mlir.policies.switches.GEMV_BY_DEFAULT` is on, the target is NVIDIA's, the problem is GEMV-like
    (:func:`is_gemv_like`), codegen would compute it by SIMT (too thin for matrix cores; no kernel of ours took
    it), the rule's lanes walk at least :data:`MIN_STEPS` positions each (fewer: a reduction too short to spread,
    where codegen's SIMT plan measured faster) and the kernel takes it with its rule's numbers."""
    if not (switches.GEMV_BY_DEFAULT and tgt.family == "nvidia" and is_gemv_like(problem)):
        return False
    if codegen.strategy != Strategy.SIMT or takes(problem):
        return False
    numbers = rule(problem, tgt)
    # lanes walking < MIN_STEPS positions: SIMT faster on every such row of the H100 final round (#gemv-by-default)
    if kernel(problem, numbers).steps < MIN_STEPS:
        return False
    return not refusals(problem, Plan(tgt.name, Strategy.EXPLICIT, gemv=numbers))


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """The GEMV kernel's plan: the rule's numbers (:func:`rule`); no tile, split or StreamK options apply.

    Raises:
        PlanError: an option the kernel does not take, or a problem it cannot compute (every reason).
    """
    opts.refuse_for("the GEMV kernel", (*Overrides._TILE, "streamk", "producers", "merge_groups", "gemm", "grouped",
                    "plan_for"), "it splits the positions into chunks by its rule")  # fmt: skip
    if opts.reduction_innermost:
        raise PlanError("reduction-innermost: True does not apply to the GEMV kernel (it reads layout 2 as it is)")
    if tgt.family != "nvidia":
        raise PlanError(f"strategy: gemv is written for NVIDIA targets, not {tgt.name}")
    why = takes(problem)
    if why:
        raise PlanError("strategy gemv: " + "; ".join(why))
    chosen = Plan(tgt.name, Strategy.EXPLICIT, gemv=rule(problem, tgt))
    why = refusals(problem, chosen)
    if why:
        raise PlanError("strategy gemv: " + "; ".join(why))
    return chosen


def refusals(problem: Any, plan: Plan) -> list[str]:
    """Why this kernel cannot carry ``plan`` out ("field: value" lines; empty: it can)."""
    why = takes(problem)
    if plan.target_info.family != "nvidia":
        why.append(f"target: {plan.target} (the GEMV kernel is written for NVIDIA only)")
    why += plan.fields_given(("tile", "split", "simt", "streamk", "wavespec", "depthwise", "merge"), "the GEMV kernel")
    if plan.gemm or plan.folded or plan.reduction_innermost:
        why.append("plan: gemm, folded or reduction_innermost (the GEMV kernel has none)")
    if not why:
        k = kernel(problem, plan.gemv)
        why += k.problems()
        cap = plan.target_info.lds_bytes
        if not why and k.shared_bytes > cap:
            why.append(f"gemv: {k.shared_bytes} B of shared memory, over {cap}")
    return why
