"""Wave specialization for the explicit sm_80 kernel in layout 2: producer warps copy, consumer warps compute.

The workgroup is ``consumers + producers`` warps. The consumers are the tiling's warps (warp ids
``0 .. consumers-1``, so their ``wm x wn`` tiles sit where :mod:`gemm_sm80` puts them); they only read
shared memory (``ldmatrix.x4.trans``), run ``mma.sync`` and store dW. The producers (warp ids after
them) do the implicit GEMM's address arithmetic and every global -> shared copy (``cp.async``,
:func:`gemm_sm80._copy_tile_cl` as it is, distributed over the producer threads only). The roles are an
``scf.if`` on the warp id, split by named barriers (PTX ``bar.sync id, n`` / ``bar.arrive id, n``,
``nvvm.barrier`` / ``nvvm.barrier.arrive`` with a barrier id and the workgroup's thread count), two a
shared-memory stage:

- ``full[s]`` (id ``1 + s``): the producers arrive once stage ``s`` holds its k tile (their own
  ``cp.async.wait_group`` first: a thread's copies are complete and visible to itself), the consumers
  wait on it before their first ``ldmatrix`` of the stage;
- ``empty[s]`` (id ``1 + stages + s``): the consumers arrive once their last ``ldmatrix`` of the stage
  is done, the producers wait on it before refilling the stage.

Why that ordering suffices: in the PTX memory model a ``bar.sync``/``bar.arrive`` synchronizes with the
``bar.sync`` that completes the same barrier, so each thread's shared-memory accesses before it (the
producers' completed copies; the consumers' reads) are ordered before every access after the waiting
side's ``bar.sync`` (the consumers' reads; the producers' next copies into the stage). Id 0 stays the
whole-workgroup ``bar.sync 0`` (``gpu.barrier``), used by neither role.

The producer announces each tile as soon as it has issued the next: after issuing tile ``kt`` it waits
for tile ``kt - 1`` (``cp.async.wait_group 1``) and arrives on its ``full``, then drains the last one
(announcing ``kt - (stages - 1)`` kept the consumers waiting on two more tiles' issue: measured in
docs/explicit-kernels.md "Wave specialization"). The consumer
arrives on ``empty`` for tile ``kt`` *before* it waits on ``full`` for tile ``kt + 1`` (the register
prefetch of gemm_sm80 loads tile ``kt + 1``'s first fragments during tile ``kt``'s last mma): with two
stages the other order deadlocks, because the producer announces tile ``kt + 1`` only after issuing tile
``kt + 2``, which needs tile ``kt``'s stage empty. Both sides skip the arrivals no one will wait
for (the last ``stages`` tiles' ``empty``), so every barrier ends complete.

Register budget: sm_80 has no ``setmaxnreg`` (Hopper's), so every warp gets the consumers' allocation and
``(consumers + producers) x 32 x registers <= 65,536`` decides which tilings take producers (the
policy's :func:`convbw_mlir.policies.sm80.wavespec_problems`): the 128x256 recipe's 8 consumer warps at ~254
registers cannot take any, 4-warp tilings (128x128, 64x128, 128x64, 64x64) take 2 or 4 (CK's "wavelet"
ratios 4:2 and 4:4).

Reused from :mod:`gemm_sm80` as they are: ``_Operand``, ``_lanes``, ``_copy_tile_cl``,
``_load_fragments``, ``_warp_mma``, ``_epilogue``, ``grid``. Not reusable: ``_mainloop`` (one role does
both halves) and ``build_kernel_body`` (one thread count): their wave-specialized forms are here.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import arith, memref, nvvm

from convbw_mlir.kernels import gemm_sm80 as g80
from convbw_mlir.kernels.ir import Ix, for_, if_
from convbw_mlir.policies.sm80 import (
    MMA_K,
    MMA_M,
    MMA_N,
    ROW_PAD,
    GemmShape,
    GemmTiling,
    copiers,
    wavespec_problems,
    wavespec_threads,
)

__all__ = ["build_kernel_body", "grid"]

grid = g80.grid


def _i32(value: int) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(32), value)


def _barrier_id(ix: Ix, first: int, stage: ir.Value | int) -> ir.Value:
    """``first + stage`` as the i32 a named barrier takes (a register operand where the stage is dynamic)."""
    if isinstance(stage, int):
        return _i32(first + stage)
    return arith.index_cast(ir.IntegerType.get_signless(32), ix.add(stage, first))


def _wait(ix: Ix, first: int, stage: ir.Value | int, count: ir.Value) -> None:
    """``bar.sync first+stage, count``: this warp arrives and waits until ``count`` threads have."""
    nvvm.barrier(barrier_id=_barrier_id(ix, first, stage), number_of_threads=count, aligned=True)


def _arrive(ix: Ix, first: int, stage: ir.Value | int, count: ir.Value) -> None:
    """``bar.arrive first+stage, count``: this warp arrives and goes on."""
    nvvm.barrier_arrive(count, barrier_id=_barrier_id(ix, first, stage), aligned=True)


def _producer(ix: Ix, t: GemmTiling, shape: GemmShape, a: g80._Operand, b: g80._Operand, ptid: ir.Value,
              g: ir.Value, base: ir.Value, producers: int, count: ir.Value) -> None:  # fmt: skip
    """The producers' loop: for each of this split's k tiles, wait ``empty`` (past the first ``stages``),
    copy it into its stage, and announce the tile before it on ``full``; then drain."""
    ktiles = -(-shape.reduction // t.bk)
    per_split = -(-ktiles // shape.splits)
    exact = per_split * shape.splits == ktiles
    # tiles a producer keeps in flight behind the one it issues: 1 announces tile kt-1 as soon as kt is
    # issued (stages-1, the first form, made the consumers wait on the producers' issue of two more tiles)
    lag = min(1, per_split)
    shared_by = copiers(t, producers)
    full, empty = 1, 1 + t.stages
    with for_(ix.c(0), ix.c(per_split), ix.c(1)) as loop:
        kt = loop.iv
        stage = ix.rem(kt, t.stages)
        with if_(arith.cmpi(arith.CmpIPredicate.uge, kt, ix.c(t.stages))):
            _wait(ix, empty, stage, count)  # the consumers are done with tile kt - stages
        tile, valid = ix.add(base, kt), None
        if not exact:  # the last split's tiles past the reduction read nothing (in bounds all the same)
            valid = ix.lt(tile, ktiles)
            tile = arith.minsi(tile, ix.c(ktiles - 1))
        for op in (a, b):
            g80._copy_tile_cl(ix, shared_by, op, ptid, g, tile, stage, valid, shape)
        nvvm.cp_async_commit_group()
        with if_(arith.cmpi(arith.CmpIPredicate.uge, kt, ix.c(lag))):
            nvvm.cp_async_wait_group(lag)  # tile kt - lag's copies are complete (this thread's)
            _arrive(ix, full, ix.rem(ix.sub(kt, lag), t.stages), count)
    for left in range(lag - 1, -1, -1):  # the last `lag` tiles: oldest first
        nvvm.cp_async_wait_group(left)
        _arrive(ix, full, (per_split - 1 - left) % t.stages, count)


def _consumer(ix: Ix, t: GemmTiling, shape: GemmShape, a: g80._Operand, b: g80._Operand, lanes: g80._Lanes,
              warp_m: ir.Value, warp_n: ir.Value, acc: list[ir.Value], count: ir.Value,
              f16: ir.Type) -> list[ir.Value]:  # fmt: skip
    """gemm_sm80's steady state without copies: wait ``full`` before a stage's first ``ldmatrix``, arrive
    ``empty`` after its last; the next step's fragments are loaded before the current step's mma."""
    ktiles = -(-shape.reduction // t.bk)
    per_split = -(-ktiles // shape.splits)
    steps = t.bk // MMA_K
    full, empty = 1, 1 + t.stages
    _wait(ix, full, 0, count)
    first = g80._load_fragments(ix, t, lanes, a.smem, b.smem, ix.c(0), warp_m, warp_n, 0, f16)
    with for_(ix.c(0), ix.c(per_split), ix.c(1), [*acc, *first]) as loop:
        kt = loop.iv
        acc, cur = loop.args[: len(acc)], loop.args[len(acc) :]
        stage = ix.rem(kt, t.stages)
        for s in range(steps):
            if s + 1 < steps:
                nxt = g80._load_fragments(ix, t, lanes, a.smem, b.smem, stage, warp_m, warp_n, s + 1, f16)
            else:
                # Tile kt is in registers: hand its stage back (unless no tile will refill it) ...
                with if_(ix.lt(ix.add(kt, t.stages), per_split)):
                    _arrive(ix, empty, stage, count)
                # ... then wait for tile kt + 1 (past the last tile the loads read a stale stage, unused).
                nxt_kt = ix.add(kt, 1)
                next_stage = ix.rem(nxt_kt, t.stages)
                with if_(ix.lt(nxt_kt, per_split)):
                    _wait(ix, full, next_stage, count)
                nxt = g80._load_fragments(ix, t, lanes, a.smem, b.smem, next_stage, warp_m, warp_n, 0, f16)
            acc = g80._warp_mma(t, cur, acc, f16)
            cur = nxt
        loop.yield_(*acc, *cur)
    return loop.results[: len(acc)]


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: GemmTiling,
                      producers: int) -> None:  # fmt: skip
    """Emit the wave-specialized kernel into ``entry`` (bindings as gemm_sm80's, layout 2 only), for
    :func:`~convbw_mlir.policies.sm80.wavespec_threads` threads and the grid :func:`grid` gives."""
    why = wavespec_problems(shape, t, producers)
    if why:
        raise ValueError("; ".join(why))
    ix = Ix(entry)
    f16 = ir.MemRefType(a.type).element_type  # f16 or bf16
    out = ir.MemRefType(c.type).element_type
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    tid, lane, warp, warp_m, warp_n = g80._threads(ix, t)
    block_m, block_n, g, where, base = g80._workgroup(ix, t, shape)
    a_tile, b_tile = [t.stages, t.bk, t.bm + ROW_PAD], [t.stages, t.bk, t.bn + ROW_PAD]
    a_smem = memref.alloc(ir.MemRefType.get(a_tile, f16, memory_space=shared), [], [])
    b_smem = memref.alloc(ir.MemRefType.get(b_tile, f16, memory_space=shared), [], [])
    a_op = g80._Operand(a, block_m, a_smem, t.bm, shape.m, shape.a_vector())
    b_op = g80._Operand(b, block_n, b_smem, t.bn, shape.n, shape.b_vector(), gather=shape.conv is not None)
    count = _i32(wavespec_threads(t, producers))  # every thread of the workgroup takes part in every named barrier
    with if_(ix.lt(warp, t.warps), else_=True) as role:  # consumers: warps 0 .. t.warps-1
        lanes = g80._lanes(ix, lane, True)
        f32v = ir.VectorType.get([2, 2], ir.F32Type.get())
        zero = arith.constant(f32v, ir.DenseElementsAttr.get_splat(f32v, ir.FloatAttr.get_f32(0.0)))
        acc = [zero] * ((t.wm // MMA_M) * (t.wn // MMA_N))
        acc = _consumer(ix, t, shape, a_op, b_op, lanes, warp_m, warp_n, acc, count, f16)
        g80._epilogue(ix, t, shape, c, where, ix.add(block_m, warp_m), ix.add(block_n, warp_n), lane, acc, out)
    with role.otherwise():  # producers: the warps after them, threads renumbered from 0
        ptid = ix.sub(tid, t.threads)
        _producer(ix, t, shape, a_op, b_op, ptid, g, base, producers, count)
