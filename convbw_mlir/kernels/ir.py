"""The toolkit the kernel builders share (docs/conventions.md names its short names).

- :class:`Ix`: ``index`` arithmetic whose constants are hoisted to the function's entry block (the sm_80 and
  AMD kernels: loops reuse them); :class:`Ints`: i32/i64 arithmetic and pointer casts whose constants are made
  where used (the sm_90a kernels: LLVM hoists them).
- Control flow as context managers that hide insertion points and yields: :class:`if_` (``scf.if``, with
  ``otherwise()`` for its else and ``yield_`` for results), :class:`for_` (``scf.for``) and :class:`while_`
  (``scf.while``: a spin loop on a condition).
- :class:`Pipeline`: the sm_90a mbarrier ring between a TMA producer and the wgmma consumers (producer
  ``acquire``/``commit``, consumer ``wait``/``release``).
- :func:`gpu_fence` (``membar.gl``) and :func:`sync` (the workgroup's or the cluster's barrier).

Each helper writes the same ops, in the same order, as the hand-written code it replaced: the lowered IR is
byte-identical (docs/plan.md "kernel toolkit: the identity check").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, llvm, nvvm, scf

__all__ = [
    "WAIT_TICKS",
    "FoldIx",
    "Ints",
    "Ix",
    "Pipeline",
    "Slot",
    "all_of",
    "for_",
    "gpu_fence",
    "if_",
    "sync",
    "unravel",
    "while_",
]

WAIT_TICKS = 0x989680  # mbarrier.try_wait's suspend-time hint (CUTLASS's value)


class Ix:
    """Index arithmetic with constants hoisted to the function's entry block (so loops reuse them)."""

    def __init__(self, entry: ir.Block) -> None:
        self.entry = entry
        self.consts: dict[int, ir.Value] = {}
        self.t = ir.IndexType.get()

    def c(self, value: int) -> ir.Value:
        if value not in self.consts:
            with ir.InsertionPoint.at_block_begin(self.entry):
                self.consts[value] = arith.constant(self.t, value)
        return self.consts[value]

    def v(self, x: ir.Value | int) -> ir.Value:
        """``x`` as a value (an int as its hoisted constant)."""
        return self.c(x) if isinstance(x, int) else x

    def add(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        if isinstance(b, int) and b == 0:
            return self.v(a)
        return arith.addi(self.v(a), self.v(b))

    def mul(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.muli(self.v(a), self.v(b))

    def div(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.divui(self.v(a), self.v(b))

    def rem(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.remui(self.v(a), self.v(b))

    def sub(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        if isinstance(b, int) and b == 0:
            return self.v(a)
        return arith.subi(self.v(a), self.v(b))

    def lt(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        """Signed ``a < b`` (convolution coordinates go negative in the padding)."""
        return arith.cmpi(arith.CmpIPredicate.slt, self.v(a), self.v(b))

    def clamp(self, a: ir.Value, hi: int) -> ir.Value:
        """``a`` clamped to ``[0, hi]``: an address that stays inside its buffer even where nothing is read."""
        return arith.minsi(arith.maxsi(a, self.c(0)), self.c(hi))


class FoldIx(Ix):
    """:class:`Ix` with products, quotients and remainders by 1 folded (the CUDA-core kernels' sizes often are 1)."""

    def mul(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return self.v(a) if isinstance(b, int) and b == 1 else super().mul(a, b)

    def div(self, a: ir.Value, b: int) -> ir.Value:
        return a if b == 1 else super().div(a, b)

    def rem(self, a: ir.Value, b: int) -> ir.Value:
        return self.c(0) if b == 1 else super().rem(a, b)


def unravel(ix: Ix, value: ir.Value, sizes: tuple[int, ...]) -> list[ir.Value]:
    """Row-major coordinates of ``value`` (inside the box) in a box of ``sizes`` (any rank, possibly none)."""
    coords, inner = [], 1
    for d in range(len(sizes) - 1, -1, -1):
        at = ix.div(value, inner)
        coords.append(at if d == 0 else ix.rem(at, sizes[d]))
        inner *= sizes[d]
    return coords[::-1]


class Ints:
    """i32/i64/index arithmetic and pointer casts, constants made where used (LLVM hoists them)."""

    def __init__(self) -> None:
        self.i1 = ir.IntegerType.get_signless(1)
        self.i32 = ir.IntegerType.get_signless(32)
        self.i64 = ir.IntegerType.get_signless(64)
        self.index = ir.IndexType.get()

    def c(self, v: int, t: ir.Type | None = None) -> ir.Value:
        return arith.constant(t or self.i32, v)

    def ptr(self, address: ir.Value, space: int) -> ir.Value:
        """An ``!llvm.ptr<space>`` from an i32 shared-memory address or an i64 global one."""
        return llvm.inttoptr(ir.Type.parse(f"!llvm.ptr<{space}>" if space else "!llvm.ptr"), address)

    def eq(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.eq, a, b)


def all_of(conds: list[ir.Value]) -> ir.Value | None:
    """The conjunction of ``conds`` (None: no condition, always true)."""
    out = None
    for c in conds:
        out = c if out is None else arith.andi(out, c)
    return out


class _Region:
    """An open block whose terminator is written on leaving it: the values given to ``yield_`` (none if
    none were given)."""

    def __init__(self) -> None:
        self._open: list[tuple[ir.InsertionPoint, list[ir.Value] | None]] = []

    def _enter(self, block: ir.Block) -> None:
        ip = ir.InsertionPoint(block)
        ip.__enter__()
        self._open.append((ip, None))

    def _leave(self, failed: bool) -> None:
        ip, values = self._open.pop()
        try:
            if not failed:
                self._terminate(values or [])
        finally:
            ip.__exit__(None, None, None)

    def _terminate(self, values: list[ir.Value]) -> None:
        scf.YieldOp(values)

    def yield_(self, *values: ir.Value) -> None:
        """The values the open block yields (written as its terminator on leaving it)."""
        if not self._open:
            raise RuntimeError("yield_: outside the block")
        self._open[-1] = (self._open[-1][0], list(values))


class if_(_Region):  # noqa: N801 - a context manager, reads as the statement
    """``scf.if cond``: ``with if_(c): ...`` builds the then block; with result ``types`` (or ``else_``),
    ``with branch.otherwise(): ...`` builds the else block; each block ends with ``branch.yield_(...)`` where
    it has results. ``results`` after both."""

    def __init__(self, cond: ir.Value, types: Sequence[ir.Type] = (), *, else_: bool = False) -> None:
        super().__init__()
        self.op = scf.IfOp(cond, list(types), has_else=bool(types) or else_)

    def __enter__(self) -> if_:
        self._enter(self.op.then_block)
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self._leave(kind is not None)

    def otherwise(self) -> _Else:
        """The else block, as a context manager."""
        return _Else(self)

    @property
    def results(self) -> list[ir.Value]:
        return list(self.op.results)


class _Else:
    def __init__(self, branch: if_) -> None:
        self.branch = branch

    def __enter__(self) -> if_:
        self.branch._enter(self.branch.op.else_block)
        return self.branch

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.branch._leave(kind is not None)


class for_(_Region):  # noqa: N801 - a context manager, reads as the statement
    """``scf.for %i = lo to hi step step iter_args(init)``: ``with for_(lo, hi, step, init) as loop:`` builds the
    body (``loop.iv``, ``loop.args``), ending with ``loop.yield_(...)`` where it carries values; ``results``
    after it."""

    def __init__(self, lo: ir.Value, hi: ir.Value, step: ir.Value, init: Sequence[ir.Value] = ()) -> None:
        super().__init__()
        self.op = scf.ForOp(lo, hi, step, list(init))

    def __enter__(self) -> for_:
        self._enter(self.op.body)
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self._leave(kind is not None)

    @property
    def iv(self) -> ir.Value:
        return self.op.induction_variable

    @property
    def args(self) -> list[ir.Value]:
        return list(self.op.inner_iter_args)

    @property
    def results(self) -> list[ir.Value]:
        return list(self.op.results)


class while_(_Region):  # noqa: N801 - a context manager, reads as the statement
    """A spin loop, ``scf.while`` with an empty body: ``with while_() as spin: ...; spin.again_if(cond)`` runs
    the block until ``cond`` is false."""

    def __init__(self) -> None:
        super().__init__()
        self.op = scf.WhileOp([], [])

    def __enter__(self) -> while_:
        self._enter(self.op.before.blocks.append())
        return self

    def again_if(self, cond: ir.Value) -> None:
        """Run the block again while ``cond`` holds (its ``scf.condition``)."""
        self.yield_(cond)

    def _terminate(self, values: list[ir.Value]) -> None:
        if len(values) != 1:
            raise RuntimeError("while_: the block ends without again_if(cond)")
        scf.ConditionOp(values[0], [])
        with ir.InsertionPoint(self.op.after.blocks.append()):
            scf.YieldOp([])

    def __exit__(self, kind: Any, *_: Any) -> None:
        self._leave(kind is not None)


def gpu_fence() -> None:
    """``membar.gl`` (CUDA's ``__threadfence``): this thread's global writes seen device-wide before what
    follows (and its reads after)."""
    nvvm.MembarOp(ir.Attribute.parse("#nvvm.mem_scope<gpu>"))


def sync(cluster: int = 1) -> None:
    """The workgroup's barrier; in a cluster (``cluster`` > 1), the cluster's (it orders the peer's accesses too)."""
    if cluster == 1:
        gpu.barrier()
        return
    nvvm.cluster_arrive()
    nvvm.cluster_wait()


@dataclass(frozen=True)
class Slot:
    """One slot of the ring: its i32 shared addresses (A tile, B tile, full and empty barriers), and the parity
    of the round a k tile takes it in (``stage``: the slot's number)."""

    stage: ir.Value
    phase: ir.Value
    a: ir.Value
    b: ir.Value
    full: ir.Value
    empty: ir.Value


class Pipeline:
    """The sm_90a mbarrier ring (CUTLASS's ``PipelineTmaAsync``) in the dynamic shared memory at ``base``:
    ``stages`` slots of an A and a B tile, then full[s] at ``barriers + 8 s`` and empty[s] at ``barriers +
    8 (stages + s)``. K tile ``kt`` (counted over all the workgroup's output tiles) takes slot ``kt % stages``
    in round ``kt / stages``.

    The producer thread: ``acquire(kt)`` (wait until the slot is empty: the previous round's parity; a fresh
    barrier passes parity 1), ``commit(slot)`` (arrive on full with the bytes its TMA loads bring; the full
    barrier completes when they land) and the TMA loads on the barrier it returns. A consumer warpgroup:
    ``wait(kt)`` (until full), its wgmmas, ``release(kt)`` once they are done (every consumer thread arrives
    on empty; in a cluster, lane 0 of each warp on both workgroups' barrier: both producers write it).

    ``t`` gives the ring's numbers (:class:`convbw_mlir.kernels.gemm_sm90.Sm90Tiling`: ``stages``,
    ``a_bytes``, ``b_bytes``, ``barriers``, ``empty_count``, ``cluster``).
    """

    def __init__(self, b: Ints, t: Any, base: ir.Value) -> None:
        self.b, self.t, self.base = b, t, base

    def init(self, tid: ir.Value) -> None:
        """Thread 0: full[s] waits for one arrival (the producer's, with the TMA bytes), empty[s] for every
        consumer thread; then all threads meet, so no one waits on an uninitialised barrier."""
        b, t = self.b, self.t
        with if_(b.eq(tid, b.c(0, b.index))):
            for s in range(t.stages):
                full = arith.addi(self.base, b.c(t.barriers + 8 * s))
                nvvm.mbarrier_init(b.ptr(full, 3), b.c(1))
                empty = arith.addi(self.base, b.c(t.barriers + 8 * (t.stages + s)))
                nvvm.mbarrier_init(b.ptr(empty, 3), b.c(t.empty_count))
            if t.cluster > 1:  # the peer's TMA and arrivals reach these barriers: initialised before either runs
                nvvm.fence_mbarrier_init()
        sync(t.cluster)

    def close(self) -> None:
        """In a cluster: no workgroup leaves while its peer may still arrive on its barriers."""
        if self.t.cluster > 1:
            sync(self.t.cluster)

    def stage_and_phase(self, kt: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Ring slot ``kt % stages`` and the parity of its round ``(kt / stages) % 2`` (i32; ``kt`` index)."""
        b, t = self.b, self.t
        k32 = arith.index_cast(b.i32, kt)
        return arith.remui(k32, b.c(t.stages)), arith.andi(arith.divui(k32, b.c(t.stages)), b.c(1))

    def addresses(self, stage: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
        """(A tile, B tile, full barrier, empty barrier) shared addresses of ring slot ``stage`` (i32)."""
        b, t, base = self.b, self.t, self.base
        a = arith.addi(base, arith.muli(stage, b.c(t.a_bytes)))
        bb = arith.addi(base, arith.addi(b.c(t.stages * t.a_bytes), arith.muli(stage, b.c(t.b_bytes))))
        full = arith.addi(base, arith.addi(b.c(t.barriers), arith.muli(stage, b.c(8))))
        empty = arith.addi(full, b.c(8 * t.stages))
        return a, bb, full, empty

    def slot(self, kt: ir.Value) -> Slot:
        """K tile ``kt``'s slot and round parity."""
        stage, phase = self.stage_and_phase(kt)
        return Slot(stage, phase, *self.addresses(stage))

    def acquire(self, kt: ir.Value) -> Slot:
        """The producer: wait until k tile ``kt``'s slot is empty (its consumers released the previous round)."""
        b = self.b
        slot = self.slot(kt)
        nvvm.mbarrier_try_wait_parity(b.ptr(slot.empty, 3), arith.xori(slot.phase, b.c(1)), b.c(WAIT_TICKS))
        return slot

    def commit(self, slot: Slot) -> ir.Value:
        """The producer: arrive on the slot's full barrier expecting the A and B tiles' bytes; returns that
        barrier (``!llvm.ptr<3>``), which the TMA loads into the slot complete."""
        b, t = self.b, self.t
        full = b.ptr(slot.full, 3)
        nvvm.mbarrier_arrive_expect_tx(full, b.c(t.a_bytes + t.b_bytes))
        return full

    def wait(self, kt: ir.Value) -> Slot:
        """A consumer: wait until k tile ``kt``'s slot is full (its TMA loads landed)."""
        b = self.b
        slot = self.slot(kt)
        nvvm.mbarrier_try_wait_parity(b.ptr(slot.full, 3), slot.phase, b.c(WAIT_TICKS))
        return slot

    def release(self, kt: ir.Value) -> None:
        """A consumer: its wgmmas have read k tile ``kt``'s slot, which the producer may refill."""
        b, t = self.b, self.t
        empty = self.slot(kt).empty
        if t.cluster == 1:
            nvvm.mbarrier_arrive(b.ptr(empty, 3), results=[b.i64])
            return
        lane = arith.remui(gpu.thread_id(gpu.Dimension.x), arith.constant(b.index, 32))
        with if_(arith.cmpi(arith.CmpIPredicate.eq, lane, arith.constant(b.index, 0))):
            for peer in range(t.cluster):
                remote = nvvm.mapa(ir.Type.parse("!llvm.ptr<7>"), b.ptr(empty, 3), b.c(peer))
                nvvm.MBarrierArriveOp(remote, results=[], scope=ir.Attribute.parse("#nvvm.mem_scope<cluster>"))
