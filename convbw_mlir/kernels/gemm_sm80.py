"""The sm_80 GEMM kernel of the explicit strategy, written with the MLIR Python builders.

``C[g, m, n] = sum_{i, r} A[i, g, m, r] * B[i, g, n, r]``: both operands reduction-contiguous (the
weight gradient of a 1x1 layout-4 convolution: A = dy as ``[N, G, K, HW]``, B = x as ``[N, G, C, HW]``,
C = dW as ``[G, K, C]``), f16 in, f32 accumulate, f32 or f16 out.

The recipe (../shared/DESIGN.md "Kernels built by our own passes": 392 TFLOP/s on the H100 for the
hand-written kernel it describes): a workgroup tile of ``bm x bn`` with reduction step ``bk``;
``stages`` shared-memory stages filled by 16-byte ``cp.async.cg`` copies, rows padded to ``bk + 8``
elements so that ``ldmatrix``'s eight row addresses fall in distinct banks; warps of ``wm x wn``, each
loading its fragments with ``ldmatrix.x4`` (A and B both K-contiguous: ``mma.sync`` row.col) and
running ``mma.sync m16n8k16``; the next k16 step's fragments are loaded before the current step's mma,
across k tiles too.

Layers, each a function with one job: :class:`GemmTiling` (the plan's numbers), :func:`_copy_tile`
(global -> shared of one operand), :func:`_load_fragments` (shared -> registers), :func:`_warp_mma`
(the warp's matrix step), :func:`_mainloop` (the software pipeline: prologue, steady state), and
:func:`_epilogue` (registers -> global).
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, memref, nvvm, scf, vector

from convbw_mlir.kernels import nvgpu
from convbw_mlir.kernels.shapes import COPY_ELEMENTS, MMA_K, MMA_M, MMA_N, WARP, GemmShape, GemmTiling

__all__ = ["build_kernel_body"]


class _Ix:
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

    def _v(self, x: ir.Value | int) -> ir.Value:
        return self.c(x) if isinstance(x, int) else x

    def add(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        if isinstance(b, int) and b == 0:
            return self._v(a)
        return arith.addi(self._v(a), self._v(b))

    def mul(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.muli(self._v(a), self._v(b))

    def div(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.divui(self._v(a), self._v(b))

    def rem(self, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        return arith.remui(self._v(a), self._v(b))


@dataclass
class _Operand:
    """One operand of the mainloop: its global memref, the workgroup's first row, its shared stages."""

    glob: ir.Value
    row0: ir.Value
    smem: ir.Value
    rows: int


def _copy_tile(ix: _Ix, t: GemmTiling, op: _Operand, tid: ir.Value, g: ir.Value, ktile: ir.Value, stage: ir.Value,
               valid: ir.Value, shape: GemmShape) -> None:  # fmt: skip
    """Issue this thread's 16-byte ``cp.async.cg`` copies of k tile ``ktile`` of ``op`` into ``stage``.

    A k tile past the end (``valid`` false) reads nothing and zero-fills, so the pipeline needs no branch.
    """
    chunks = t.bk // COPY_ELEMENTS
    per_pass = t.threads // chunks  # rows one pass of all threads covers
    tiles_per_image = shape.hw // t.bk
    image = ix.div(ktile, tiles_per_image)
    hw0 = ix.mul(ix.rem(ktile, tiles_per_image), t.bk)
    row = ix.div(tid, chunks)
    col = ix.mul(ix.rem(tid, chunks), COPY_ELEMENTS)
    src_elements = arith.select(valid, ix.c(COPY_ELEMENTS), ix.c(0))
    for i in range(op.rows // per_pass):
        r = ix.add(row, i * per_pass)
        nvgpu.async_copy(op.smem, [stage, r, col], op.glob, [image, g, ix.add(op.row0, r), ix.add(hw0, col)],
                         COPY_ELEMENTS, src_elements)  # fmt: skip


@dataclass
class _Lanes:
    """Per-lane ``ldmatrix`` row addresses, computed once (Figure "ldmatrix" of the PTX ISA)."""

    a_row: ir.Value  # lanes 0-15 rows 0-15 at k 0, lanes 16-31 the same rows at k 8
    a_col: ir.Value
    b_row: ir.Value  # matrices (n 0-7, k 0), (n 0-7, k 8), (n 8-15, k 0), (n 8-15, k 8)
    b_col: ir.Value


def _load_fragments(ix: _Ix, t: GemmTiling, lanes: _Lanes, a_smem: ir.Value, b_smem: ir.Value, stage: ir.Value,
                    warp_m: ir.Value, warp_n: ir.Value, step: int, f16: ir.Type) -> list[ir.Value]:  # fmt: skip
    """The warp's A and B fragments of k16 step ``step``: ``wm/16`` A x4 loads, ``wn/16`` B x4 loads."""
    k = step * MMA_K
    a_col = ix.add(lanes.a_col, k)
    b_col = ix.add(lanes.b_col, k)
    frags = []
    for i in range(t.wm // MMA_M):
        frags.append(nvgpu.ldmatrix(a_smem, [stage, ix.add(ix.add(warp_m, lanes.a_row), i * MMA_M), a_col], 4, f16))
    for j in range(t.wn // (2 * MMA_N)):
        row = ix.add(ix.add(warp_n, lanes.b_row), j * 2 * MMA_N)
        frags.append(nvgpu.ldmatrix(b_smem, [stage, row, b_col], 4, f16))
    return frags


def _warp_mma(t: GemmTiling, frags: list[ir.Value], acc: list[ir.Value], f16: ir.Type) -> list[ir.Value]:
    """One k16 step of the warp: ``(wm/16) x (wn/8)`` ``mma.sync`` on the accumulators (row-major by m tile)."""
    tiles_m = t.wm // MMA_M
    a, b = frags[:tiles_m], frags[tiles_m:]
    half = ir.VectorType.get([2, 2], f16)
    bs = [vector.extract_strided_slice(half, bf, [h * 2, 0], [2, 2], [1, 1]) for bf in b for h in range(2)]
    tiles_n = t.wn // MMA_N
    return [nvgpu.mma_sync(a[i], bs[j], acc[i * tiles_n + j]) for i in range(tiles_m) for j in range(tiles_n)]


def _mainloop(ix: _Ix, t: GemmTiling, shape: GemmShape, a: _Operand, b: _Operand, lanes: _Lanes, tid: ir.Value,
              g: ir.Value, warp_m: ir.Value, warp_n: ir.Value, acc: list[ir.Value],
              f16: ir.Type) -> list[ir.Value]:  # fmt: skip
    """The software pipeline over the k tiles; returns the accumulators.

    Prologue: tiles 0 .. stages-2 in flight, tile 0's first fragments loaded. Iteration ``kt``, k16 step
    ``s``: at s = 0 tile ``kt + stages - 1`` is issued into the stage tile ``kt - 1`` left (every warp
    passed the barrier after its last read); before each step's mma the next step's fragments are
    loaded, at the last step those of tile ``kt + 1``, after waiting for its copies and a barrier.
    One commit group per tile, empty ones included, keeps ``wait_group(stages - 2)`` exact.
    """
    ktiles = shape.images * shape.hw // t.bk
    steps = t.bk // MMA_K
    i1 = ir.IntegerType.get_signless(1)
    true = arith.constant(i1, 1)
    for s in range(t.stages - 1):
        valid = true if s < ktiles else arith.constant(i1, 0)
        for op in (a, b):
            _copy_tile(ix, t, op, tid, g, ix.c(min(s, ktiles - 1)), ix.c(s), valid, shape)
        nvvm.cp_async_commit_group()
    nvvm.cp_async_wait_group(t.stages - 2)
    gpu.barrier()
    first = _load_fragments(ix, t, lanes, a.smem, b.smem, ix.c(0), warp_m, warp_n, 0, f16)
    loop = scf.ForOp(ix.c(0), ix.c(ktiles), ix.c(1), [*acc, *first])
    with ir.InsertionPoint(loop.body):
        kt = loop.induction_variable
        args = list(loop.inner_iter_args)
        acc, cur = args[: len(acc)], args[len(acc) :]
        stage = ix.rem(kt, t.stages)
        for s in range(steps):
            if s == 0:
                ahead = ix.add(kt, t.stages - 1)
                valid = arith.cmpi(arith.CmpIPredicate.ult, ahead, ix.c(ktiles))
                src_tile = arith.minui(ahead, ix.c(ktiles - 1))  # in bounds even where nothing is read
                for op in (a, b):
                    _copy_tile(ix, t, op, tid, g, src_tile, ix.rem(ahead, t.stages), valid, shape)
                nvvm.cp_async_commit_group()
            if s + 1 < steps:
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, stage, warp_m, warp_n, s + 1, f16)
            else:
                # Tile kt+1 is complete once at most stages-2 newer groups are pending.
                nvvm.cp_async_wait_group(t.stages - 2)
                gpu.barrier()
                next_stage = ix.rem(ix.add(kt, 1), t.stages)
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, next_stage, warp_m, warp_n, 0, f16)
            acc = _warp_mma(t, cur, acc, f16)
            cur = nxt
        scf.YieldOp([*acc, *cur])
    nvvm.cp_async_wait_group(0)  # no copy may outlive the kernel's shared memory
    return list(loop.results)[: len(acc)]


def _epilogue(ix: _Ix, t: GemmTiling, c: ir.Value, g: ir.Value, row0: ir.Value, col0: ir.Value, lane: ir.Value,
              acc: list[ir.Value], out: ir.Type) -> None:  # fmt: skip
    """Store the accumulators: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) .. +1 of each 16x8 tile."""
    f32 = ir.F32Type.get()
    pair_t = ir.VectorType.get([2], out)
    row = ix.add(row0, ix.div(lane, 4))
    col = ix.add(col0, ix.mul(ix.rem(lane, 4), 2))
    tiles_n = t.wn // MMA_N
    for i in range(t.wm // MMA_M):
        for j in range(tiles_n):
            for h in range(2):
                pair = vector.extract(acc[i * tiles_n + j], [], [h])
                if out != f32:
                    pair = arith.truncf(pair_t, pair)
                vector.store(pair, c, [g, ix.add(row, i * MMA_M + h * 8), ix.add(col, j * MMA_N)])


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: GemmTiling) -> None:
    """Emit the kernel into ``entry`` (its operands already bound): grid ``(n/bn, m/bm, groups)``.

    Args:
        a: ``memref<images x groups x m x hw x f16>``; b: ``memref<images x groups x n x hw x f16>``;
        c: ``memref<groups x m x n x (f32|f16)>``.
    """
    ix = _Ix(entry)
    f16 = ir.F16Type.get()
    out = ir.MemRefType(c.type).element_type
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    tid = gpu.thread_id(gpu.Dimension.x)
    lane = ix.rem(tid, WARP)
    warp = ix.div(tid, WARP)
    warps_n = t.bn // t.wn
    warp_m = ix.mul(ix.div(warp, warps_n), t.wm)
    warp_n = ix.mul(ix.rem(warp, warps_n), t.wn)
    block_n = ix.mul(gpu.block_id(gpu.Dimension.x), t.bn)
    block_m = ix.mul(gpu.block_id(gpu.Dimension.y), t.bm)
    g = gpu.block_id(gpu.Dimension.z)
    a_smem = memref.alloc(ir.MemRefType.get([t.stages, t.bm, t.row], f16, memory_space=shared), [], [])
    b_smem = memref.alloc(ir.MemRefType.get([t.stages, t.bn, t.row], f16, memory_space=shared), [], [])
    lanes = _Lanes(
        a_row=ix.rem(lane, 16),
        a_col=ix.mul(ix.div(lane, 16), 8),
        b_row=ix.add(ix.rem(lane, 8), ix.mul(ix.div(lane, 16), 8)),
        b_col=ix.mul(ix.rem(ix.div(lane, 8), 2), 8),
    )
    zero = arith.constant(ir.VectorType.get([2, 2], ir.F32Type.get()), ir.DenseElementsAttr.get_splat(
        ir.VectorType.get([2, 2], ir.F32Type.get()), ir.FloatAttr.get_f32(0.0)))  # fmt: skip
    acc = [zero] * ((t.wm // MMA_M) * (t.wn // MMA_N))
    acc = _mainloop(ix, t, shape, _Operand(a, block_m, a_smem, t.bm), _Operand(b, block_n, b_smem, t.bn), lanes, tid,
                    g, warp_m, warp_n, acc, f16)  # fmt: skip
    _epilogue(ix, t, c, g, ix.add(block_m, warp_m), ix.add(block_n, warp_n), lane, acc, out)
