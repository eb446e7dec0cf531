"""The AMD explicit kernel, and its CDNA (MFMA) form: ``amdgpu.mfma`` 16x16x16 f16 or bf16 -> f32.

``C[g, m, n] = sum_r A[g, m, r] * B[g, n, r]``, the implicit GEMM of a layout-4 weight gradient
(``convbw_mlir.policies.sm80``): A = dy ``[N, G, K, Ho*Wo]``; B = x ``[N, G, C, Ho*Wo]`` for a plain 1x1
GEMM, else gathered from x ``[N, G, C, H, W]`` at the convolution's coordinates (the address arithmetic
of ``gemm_sm80._element_address``, per element of the tile: no im2col buffer); C = dW ``[G, K, C*Y*X]``
or the split-K partials ``[splits, G, K, C*Y*X]`` f32.

The AMD pipeline of the issue: global -> registers -> LDS, double-buffered: tile kt+1 is loaded into
registers while tile kt's matrix instructions run, then stored to the other LDS buffer before the
barrier. LDS is a static ``memref.alloc`` in workgroup space (IREE launches HIP kernels with no dynamic
LDS: docs/iree-facts.md "AMD: static LDS"), rows padded by 8 elements. Each wave computes ``wm x wn`` in 16x16 tiles.
Ragged M, N and reduction are zero-filled on load and masked on store.

Layout 2 (NHWGC/GKYXC/NHWGK, ``shape.channels_last``, CK's and MIOpen's default for grouped bwd-weight):
A = dy ``[N*Ho*Wo, G, K]``, B = x ``[N*H*W, G, C]`` (plain) or ``[N, H, W, G, C]`` (gathered), C = dW
``[G, K, Y*X*C]``. Both operands are reduction-outer with channels contiguous, so a thread loads 8 (4,
2, 1: whatever divides K or C) consecutive channels of one r in one 16-byte global load and stores them
transposed into the same k-contiguous LDS rows as layout 4 (:func:`_global_load_cl`,
:func:`_lds_store_cl`): the fragment reads and the matrix forms are the same in both layouts.

f16 or bf16 in (the bindings' element type), f32 accumulate, dW f32, f16 or bf16.

What differs between MFMA and the WMMA forms (``gemm_rdna``) is one :class:`MatrixForm`: which LDS
elements a lane reads for a fragment, the instruction, and where a lane's accumulators land.

MFMA fragments (AMD's matrix instruction calculator, ``v_mfma_f32_16x16x16_f16``): lane l holds
A[l % 16][4(l / 16) .. +3] and B[4(l / 16) .. +3][l % 16]; the result D[4(l / 16) + e][l % 16], e = 0..3.
Both operands are contiguous along k in LDS, so each fragment is one 8-byte LDS read.

No AMD GPU exists here: this kernel is compiled and its ISA checked (v_mfma, no scratch), never run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from iree.compiler import ir
from iree.compiler.dialects import amdgpu, arith, gpu, memref, scf, vector

from convbw_mlir.kernels.gemm_sm80 import _element_address, _gather_coords, _Operand, _unravel
from convbw_mlir.kernels.ir import Ix, all_of
from convbw_mlir.policies.amd import AMD_FORMS, AMD_LOAD, CDNA_INTRINSIC, CdnaTiling
from convbw_mlir.policies.sm80 import GemmShape

__all__ = ["FORMS", "MatrixForm", "build_amd_kernel", "build_kernel_body", "grid", "with_bf16"]

TILE = 16  # the 16x16x16 instructions' M, N and K


@dataclass(frozen=True)
class MatrixForm:
    """One 16x16x16 f16 (or bf16) -> f32 matrix instruction as a wave sees it.

    Attributes:
        intrinsic: IREE's name of it (a key of ``policies.amd.AMD_FORMS``).
        frag: f16/bf16 of A (and of B) a lane holds.
        acc: f32 accumulators a lane holds.
        k_lanes: lanes 0-15 hold k ``[0, frag)``; lane l starts at ``(l / 16) * k_lanes`` (0: every lane
            holds all 16 k, lanes 16-31 repeating 0-15).
        acc_row: accumulator e of lane l is D[acc_row(l / 16, e)][l % 16].
    """

    intrinsic: str
    frag: int
    acc: int
    k_lanes: int
    acc_row: tuple[int, int]  # (factor of l / 16, factor of e): row = a * (l / 16) + b * e

    def mma(self, a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
        return amdgpu.mfma(TILE, TILE, TILE, a, b, acc, blocks=1)


MFMA = MatrixForm(CDNA_INTRINSIC, 4, 4, 4, (4, 1))


def with_bf16(forms: tuple[MatrixForm, ...]) -> dict[str, MatrixForm]:
    """``forms`` by intrinsic, each also under its bf16 name (the same lane maps: AMD's calculator)."""
    out = {}
    for f in forms:
        out[f.intrinsic] = f
        out[f.intrinsic.removesuffix("_F16") + "_BF16"] = replace(
            f, intrinsic=f.intrinsic.removesuffix("_F16") + "_BF16"
        )
    return out


FORMS: dict[str, MatrixForm] = with_bf16((MFMA,))


def grid(shape: GemmShape, t: CdnaTiling) -> tuple[int, int, int]:
    """Workgroups: N tiles, M tiles, groups x splits."""
    return -(-shape.n // t.bn), -(-shape.m // t.bm), shape.groups * shape.splits


def _zero(vec: ir.Type) -> ir.Value:
    return arith.constant(vec, ir.DenseElementsAttr.get_splat(vec, ir.FloatAttr.get(ir.VectorType(vec).element_type,
                                                                                     0.0)))  # fmt: skip


def _global_load(ix: Ix, t: CdnaTiling, shape: GemmShape, op: _Operand, tid: ir.Value, g: ir.Value, ktile: ir.Value,
                 valid: ir.Value | None, elem: ir.Type) -> list[tuple[ir.Value, int, int]]:  # fmt: skip
    """This thread's share of k tile ``ktile`` of ``op`` into registers: ``(vector, pass, column offset)``.

    Rows contiguous along r load ``op.vector`` elements at a time (16 bytes where 8 | Ho*Wo); a gathered
    B loads its 8 elements one by one at the convolution's coordinates. Anything past the rows, the
    reduction or the image (or a tile past the split, ``valid`` false) is zero.
    """
    chunks = t.bk // AMD_LOAD
    per_pass = t.threads // chunks
    col = ix.mul(ix.rem(tid, chunks), AMD_LOAD)
    r0 = ix.add(ix.mul(ktile, t.bk), col)
    ragged_r = shape.reduction % t.bk != 0
    out = []
    for i in range(op.rows // per_pass):
        lrow = ix.add(ix.div(tid, chunks), i * per_pass)
        grow = ix.add(op.row0, lrow)
        conds = [] if valid is None else [valid]
        if op.extent % op.rows:
            conds.append(ix.lt(grow, op.extent))
            grow = arith.minsi(grow, ix.c(op.extent - 1))  # in bounds even where nothing is read
        v = op.vector
        if v > 1:
            vec_t = ir.VectorType.get([v], elem)
            for s in range(AMD_LOAD // v):
                r = ix.add(r0, s * v)
                in_r = [ix.lt(r, shape.reduction)] if ragged_r else []
                if in_r:
                    r = arith.minsi(r, ix.c(shape.reduction - v))
                idx, ok = _element_address(ix, shape, op, g, grow, r, conds + in_r)
                x = vector.load(vec_t, op.glob, idx)
                out.append((x if ok is None else arith.select(ok, x, _zero(vec_t)), i, s * v))
            continue
        values = []
        for e in range(AMD_LOAD):
            r = ix.add(r0, e)
            in_r = [ix.lt(r, shape.reduction)] if ragged_r else []
            if in_r:
                r = arith.minsi(r, ix.c(shape.reduction - 1))
            idx, ok = _element_address(ix, shape, op, g, grow, r, conds + in_r)
            x = memref.load(op.glob, idx)
            values.append(x if ok is None else arith.select(ok, x, arith.constant(elem, 0.0)))
        out.append((vector.from_elements(ir.VectorType.get([AMD_LOAD], elem), values), i, 0))
    return out


def _lds_store(ix: Ix, t: CdnaTiling, lds: ir.Value, stage: ir.Value, tid: ir.Value,
               values: list[tuple[ir.Value, int, int]]) -> None:  # fmt: skip
    """The registers :func:`_global_load` filled, into LDS buffer ``stage`` (the same thread's places)."""
    chunks = t.bk // AMD_LOAD
    per_pass = t.threads // chunks
    row, col = ix.div(tid, chunks), ix.mul(ix.rem(tid, chunks), AMD_LOAD)
    for v, i, off in values:
        vector.store(v, lds, [stage, ix.add(row, i * per_pass), ix.add(col, off)])


def _cl_address(ix: Ix, shape: GemmShape, op: _Operand, g: ir.Value, row: ir.Value, r: ir.Value,
                valid: list[ir.Value]) -> tuple[list[ir.Value], ir.Value | None]:  # fmt: skip
    """Layout 2: indices of the vector of channels at (``row``, ``r``) of ``op``, clamped inside its memref,
    and whether it is real. dy and a plain x are ``[r, g, row]``; a gathered x is ``[N, H, W, G, C]`` at
    ``(ho * s + y * d - p, wo * s + x * d - p)`` with ``row = (y * X + x) * C + c`` (dW's GKYXC order)."""
    if not op.gather:
        return [r, g, row], all_of(valid)
    conv = shape.conv
    c, tap = ix.rem(row, shape.channels), ix.div(row, shape.channels)
    image, pos = ix.div(r, shape.hw), ix.rem(r, shape.hw)
    coords, valid = _gather_coords(ix, conv, _unravel(ix, pos, conv.out_size), _unravel(ix, tap, conv.filter), valid)
    return [image, *coords, g, c], all_of(valid)


def _global_load_cl(ix: Ix, t: CdnaTiling, shape: GemmShape, op: _Operand, tid: ir.Value, g: ir.Value,
                    ktile: ir.Value, valid: ir.Value | None, elem: ir.Type) -> list[tuple[ir.Value, ...]]:  # fmt: skip
    """Layout 2: this thread's vectors of ``op.vector`` channels (16 bytes where 8 divide K or C) of k tile
    ``ktile``: ``(vector, its first row in the tile, its r in the tile)``. Vector ``q = tid + pass x threads``
    of the tile is rows ``v (q % (rows / v))`` .. +v-1 at r ``q / (rows / v)``: consecutive lanes read
    consecutive channels. A vector past M or N (v divides K and C: whole vectors are in or out), the
    reduction, the split or the image (gathered x) is zero."""
    v = op.vector
    chunks = op.rows // v
    vec_t = ir.VectorType.get([v], elem)
    out = []
    for i in range(op.rows * t.bk // v // t.threads):
        q = ix.add(tid, i * t.threads)
        lrow, lr = ix.mul(ix.rem(q, chunks), v), ix.div(q, chunks)
        grow = ix.add(op.row0, lrow)
        r = ix.add(ix.mul(ktile, t.bk), lr)
        conds = [] if valid is None else [valid]
        if op.extent % op.rows:
            conds.append(ix.lt(grow, op.extent))
            grow = arith.minsi(grow, ix.c(op.extent - v))  # in bounds even where nothing is read
        if shape.reduction % t.bk:
            conds.append(ix.lt(r, shape.reduction))
            r = arith.minsi(r, ix.c(shape.reduction - 1))
        idx, ok = _cl_address(ix, shape, op, g, grow, r, conds)
        x = vector.load(vec_t, op.glob, idx)
        out.append((x if ok is None else arith.select(ok, x, _zero(vec_t)), lrow, lr))
    return out


def _lds_store_cl(ix: Ix, lds: ir.Value, stage: ir.Value, values: list[tuple[ir.Value, ...]]) -> None:
    """Layout 2: :func:`_global_load_cl`'s vectors into LDS transposed, one element a row (the fragments
    read k-contiguous rows in both layouts, so the transpose happens once, here, not in every wave)."""
    for x, lrow, lr in values:
        for e in range(ir.VectorType(x.type).shape[0]):
            memref.store(vector.extract(x, [], [e]), lds, [stage, ix.add(lrow, e), lr])


def build_amd_kernel(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: CdnaTiling,
                     form: MatrixForm) -> None:  # fmt: skip
    """Emit the kernel into ``entry`` with the matrix instruction ``form``; operands as in the module doc."""
    ix = Ix(entry)
    elem, f32 = ir.MemRefType(a.type).element_type, ir.F32Type.get()  # f16 or bf16
    out = ir.MemRefType(c.type).element_type
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    tid = gpu.thread_id(gpu.Dimension.x)
    lane, wave = ix.rem(tid, t.wave), ix.div(tid, t.wave)
    waves_n = t.bn // t.wn
    wave_m, wave_n = ix.mul(ix.div(wave, waves_n), t.wm), ix.mul(ix.rem(wave, waves_n), t.wn)
    block_n = ix.mul(gpu.block_id(gpu.Dimension.x), t.bn)
    block_m = ix.mul(gpu.block_id(gpu.Dimension.y), t.bm)
    z = gpu.block_id(gpu.Dimension.z)
    ktiles = -(-shape.reduction // t.bk)
    per_split = -(-ktiles // shape.splits)
    if shape.splits == 1:
        g, where, base = z, [z], ix.c(0)
    else:
        g, split = ix.rem(z, shape.groups), ix.div(z, shape.groups)
        where, base = [split, g], ix.mul(split, per_split)
    exact = per_split * shape.splits == ktiles  # every split's every tile is real
    a_lds = memref.alloc(ir.MemRefType.get([2, t.bm, t.row], elem, memory_space=shared), [], [])
    b_lds = memref.alloc(ir.MemRefType.get([2, t.bn, t.row], elem, memory_space=shared), [], [])
    a_op = _Operand(a, block_m, a_lds, t.bm, shape.m, shape.a_vector())
    b_op = _Operand(b, block_n, b_lds, t.bn, shape.n, shape.b_vector(), gather=shape.conv is not None)
    frag_row = ix.rem(lane, TILE)
    frag_k = ix.mul(ix.div(lane, TILE), form.k_lanes) if form.k_lanes else ix.c(0)
    frag_t = ir.VectorType.get([form.frag], elem)
    acc_t = ir.VectorType.get([form.acc], f32)
    tiles_m, tiles_n = t.wm // TILE, t.wn // TILE

    def load(local: ir.Value | int) -> tuple[list, list]:
        """Tile ``local`` of this split into registers (zero past the split's or the reduction's end)."""
        valid = None
        if isinstance(local, int):
            tile = ix.add(base, local)
        else:
            tile = ix.add(base, arith.minsi(local, ix.c(per_split - 1)))  # the last iteration reloads the last tile
        if not exact:
            valid = ix.lt(tile, ktiles)
            tile = arith.minsi(tile, ix.c(ktiles - 1))
        fetch = _global_load_cl if shape.channels_last else _global_load
        return fetch(ix, t, shape, a_op, tid, g, tile, valid, elem), fetch(
            ix, t, shape, b_op, tid, g, tile, valid, elem
        )

    def store(stage: ir.Value, regs: tuple[list, list]) -> None:
        for lds, values in ((a_lds, regs[0]), (b_lds, regs[1])):
            if shape.channels_last:
                _lds_store_cl(ix, lds, stage, values)
            else:
                _lds_store(ix, t, lds, stage, tid, values)

    store(ix.c(0), load(0))
    gpu.barrier()
    loop = scf.ForOp(ix.c(0), ix.c(per_split), ix.c(1), [_zero(acc_t)] * (tiles_m * tiles_n))
    with ir.InsertionPoint(loop.body):
        kt = loop.induction_variable
        acc = list(loop.inner_iter_args)
        stage = ix.rem(kt, 2)
        # Tile kt+1 into registers first, so its global latency hides behind this tile's matrix instructions.
        nxt = load(ix.add(kt, 1))
        for s in range(t.bk // TILE):
            k = ix.add(frag_k, s * TILE)
            fa = [vector.load(frag_t, a_lds, [stage, ix.add(wave_m, ix.add(frag_row, i * TILE)), k])
                  for i in range(tiles_m)]  # fmt: skip
            fb = [vector.load(frag_t, b_lds, [stage, ix.add(wave_n, ix.add(frag_row, j * TILE)), k])
                  for j in range(tiles_n)]  # fmt: skip
            acc = [form.mma(fa[i], fb[j], acc[i * tiles_n + j]) for i in range(tiles_m) for j in range(tiles_n)]
        store(ix.rem(ix.add(kt, 1), 2), nxt)
        gpu.barrier()  # the other buffer is written, this one read by every wave
        scf.YieldOp(acc)
    _epilogue(ix, t, shape, form, c, where, ix.add(block_m, wave_m), ix.add(block_n, wave_n), lane,
              list(loop.results), out)  # fmt: skip


def _epilogue(ix: Ix, t: CdnaTiling, shape: GemmShape, form: MatrixForm, c: ir.Value, where: list[ir.Value],
              row0: ir.Value, col0: ir.Value, lane: ir.Value, acc: list[ir.Value], out: ir.Type) -> None:  # fmt: skip
    """Store the accumulators element by element (rows past M, columns past N are not stored)."""
    f32 = ir.F32Type.get()
    half = ix.div(lane, TILE)
    col = ix.add(col0, ix.rem(lane, TILE))
    row = ix.add(row0, ix.mul(half, form.acc_row[0])) if form.acc_row[0] else row0
    tiles_n = t.wn // TILE
    for i in range(t.wm // TILE):
        for j in range(tiles_n):
            cc = ix.add(col, j * TILE)
            col_ok = [ix.lt(cc, shape.n)] if shape.n % t.bn else []
            for e in range(form.acc):
                v = vector.extract(acc[i * tiles_n + j], [], [e])
                if out != f32:
                    v = arith.truncf(out, v)
                r = ix.add(row, i * TILE + e * form.acc_row[1])
                cond = all_of(([ix.lt(r, shape.m)] if shape.m % t.bm else []) + col_ok)
                if cond is None:
                    memref.store(v, c, [*where, r, cc])
                    continue
                branch = scf.IfOp(cond)
                with ir.InsertionPoint(branch.then_block):
                    memref.store(v, c, [*where, r, cc])
                    scf.YieldOp([])


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: CdnaTiling) -> None:
    """Emit the CDNA kernel into ``entry`` (the MFMA form of ``t.intrinsic``)."""
    if t.intrinsic not in FORMS or AMD_FORMS[t.intrinsic][:2] != (FORMS[t.intrinsic].frag, FORMS[t.intrinsic].acc):
        raise ValueError(f"intrinsic: {t.intrinsic} has no MFMA form here (forms: {', '.join(FORMS)})")
    build_amd_kernel(entry, a, b, c, shape, t, FORMS[t.intrinsic])
