"""The CDNA (gfx942) form of the explicit GEMM kernel: ``amdgpu.mfma`` 16x16x16 f16 -> f32.

``C[g, m, n] = sum_{i, r} A[i, g, m, r] * B[i, g, n, r]`` for a 1x1 layout-4 weight gradient (the plain
GEMM form of ``gemm_sm80``; no gathered operand, no split, aligned shapes only). The AMD pipeline of the
issue: global -> registers -> LDS, double-buffered: tile kt+1 is loaded into registers while tile kt's
MFMAs run, then stored to the other LDS buffer before the barrier. LDS is a static ``memref.alloc`` in
workgroup space (IREE launches HIP kernels with no dynamic LDS: ../shared/DESIGN.md), rows padded by
8 elements. Waves of 64 lanes, each a ``wm x wn`` tile of 16x16 MFMA tiles.

Fragments (AMD's matrix instruction calculator, ``v_mfma_f32_16x16x16_f16``): lane l holds A[l % 16][4(l / 16)
.. +3] and B[4(l / 16) .. +3][l % 16]; the result D[4(l / 16) + e][l % 16], e = 0..3. Both operands are
contiguous along k in LDS, so each fragment is one 8-byte LDS read.

No AMD GPU exists here: this kernel is compiled and its ISA checked (v_mfma, no scratch), never run.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import amdgpu, arith, gpu, memref, scf, vector

from convbw_mlir.kernels.gemm_sm80 import _Ix
from convbw_mlir.kernels.shapes import CdnaTiling, GemmShape

__all__ = ["build_kernel_body", "grid"]

MFMA = 16  # the 16x16x16 instruction's M, N and K
LOAD = 8  # f16 elements of one 16-byte global load


def grid(shape: GemmShape, t: CdnaTiling) -> tuple[int, int, int]:
    """Workgroups: N tiles, M tiles, groups."""
    return shape.n // t.bn, shape.m // t.bm, shape.groups


def _global_load(ix: _Ix, t: CdnaTiling, glob: ir.Value, row0: ir.Value, rows: int, tid: ir.Value, g: ir.Value,
                 ktile: ir.Value, shape: GemmShape) -> list[ir.Value]:  # fmt: skip
    """This thread's 16-byte loads of one k tile of an operand (into registers)."""
    chunks = t.bk // LOAD
    per_pass = t.threads // chunks
    r = ix.add(ix.mul(ktile, t.bk), ix.mul(ix.rem(tid, chunks), LOAD))
    image, pos = ix.div(r, shape.hw), ix.rem(r, shape.hw)
    vec = ir.VectorType.get([LOAD], ir.F16Type.get())
    return [vector.load(vec, glob, [image, g, ix.add(row0, ix.add(ix.div(tid, chunks), i * per_pass)), pos])
            for i in range(rows // per_pass)]  # fmt: skip


def _lds_store(ix: _Ix, t: CdnaTiling, lds: ir.Value, stage: ir.Value, tid: ir.Value, values: list[ir.Value]) -> None:
    chunks = t.bk // LOAD
    per_pass = t.threads // chunks
    col = ix.mul(ix.rem(tid, chunks), LOAD)
    for i, v in enumerate(values):
        vector.store(v, lds, [stage, ix.add(ix.div(tid, chunks), i * per_pass), col])


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: CdnaTiling) -> None:
    """Emit the kernel into ``entry``; operands as in ``gemm_sm80.build_kernel_body`` (plain GEMM form)."""
    ix = _Ix(entry)
    f16, f32 = ir.F16Type.get(), ir.F32Type.get()
    out = ir.MemRefType(c.type).element_type
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    tid = gpu.thread_id(gpu.Dimension.x)
    lane, wave = ix.rem(tid, t.wave), ix.div(tid, t.wave)
    waves_n = t.bn // t.wn
    wave_m, wave_n = ix.mul(ix.div(wave, waves_n), t.wm), ix.mul(ix.rem(wave, waves_n), t.wn)
    block_n = ix.mul(gpu.block_id(gpu.Dimension.x), t.bn)
    block_m = ix.mul(gpu.block_id(gpu.Dimension.y), t.bm)
    g = gpu.block_id(gpu.Dimension.z)
    a_lds = memref.alloc(ir.MemRefType.get([2, t.bm, t.row], f16, memory_space=shared), [], [])
    b_lds = memref.alloc(ir.MemRefType.get([2, t.bn, t.row], f16, memory_space=shared), [], [])
    frag_row, frag_k = ix.rem(lane, MFMA), ix.mul(ix.div(lane, MFMA), 4)
    frag_t = ir.VectorType.get([4], f16)
    acc_t = ir.VectorType.get([4], f32)
    zero = arith.constant(acc_t, ir.DenseElementsAttr.get_splat(acc_t, ir.FloatAttr.get_f32(0.0)))
    tiles_m, tiles_n = t.wm // MFMA, t.wn // MFMA
    ktiles = shape.reduction // t.bk

    def load(ktile: ir.Value) -> list[ir.Value]:
        return (_global_load(ix, t, a, block_m, t.bm, tid, g, ktile, shape)
                + _global_load(ix, t, b, block_n, t.bn, tid, g, ktile, shape))  # fmt: skip

    def store(stage: ir.Value, regs: list[ir.Value]) -> None:
        na = len(regs) * t.bm // (t.bm + t.bn)
        _lds_store(ix, t, a_lds, stage, tid, regs[:na])
        _lds_store(ix, t, b_lds, stage, tid, regs[na:])

    store(ix.c(0), load(ix.c(0)))
    gpu.barrier()
    loop = scf.ForOp(ix.c(0), ix.c(ktiles), ix.c(1), [zero] * (tiles_m * tiles_n))
    with ir.InsertionPoint(loop.body):
        kt = loop.induction_variable
        acc = list(loop.inner_iter_args)
        stage = ix.rem(kt, 2)
        # Tile kt+1 into registers first, so its global latency hides behind this tile's MFMAs
        # (the last iteration reloads the last tile: in bounds, stored to the buffer no one reads again).
        nxt = load(arith.minui(ix.add(kt, 1), ix.c(ktiles - 1)))
        for s in range(t.bk // MFMA):
            k = ix.add(frag_k, s * MFMA)
            fa = [vector.load(frag_t, a_lds, [stage, ix.add(wave_m, ix.add(frag_row, i * MFMA)), k])
                  for i in range(tiles_m)]  # fmt: skip
            fb = [vector.load(frag_t, b_lds, [stage, ix.add(wave_n, ix.add(frag_row, j * MFMA)), k])
                  for j in range(tiles_n)]  # fmt: skip
            acc = [amdgpu.mfma(MFMA, MFMA, MFMA, fa[i], fb[j], acc[i * tiles_n + j], blocks=1)
                   for i in range(tiles_m) for j in range(tiles_n)]  # fmt: skip
        store(ix.rem(ix.add(kt, 1), 2), nxt)
        gpu.barrier()  # the other buffer is written, this one read by every wave
        scf.YieldOp(acc)
    acc = list(loop.results)
    row = ix.add(ix.add(block_m, wave_m), frag_k)  # D rows 4(l / 16) + e
    col = ix.add(ix.add(block_n, wave_n), frag_row)  # D column l % 16
    for i in range(tiles_m):
        for j in range(tiles_n):
            for e in range(4):
                v = vector.extract(acc[i * tiles_n + j], [], [e])
                if out != f32:
                    v = arith.truncf(out, v)
                memref.store(v, c, [g, ix.add(row, i * MFMA + e), ix.add(col, j * MFMA)])
