"""The sm_80 kernel of the explicit strategy, written with the MLIR Python builders.

``C[g, m, n] = sum_r A[g, m, r] * B[g, n, r]``, the implicit GEMM of a layout-4 weight gradient
(``convbw_mlir.policies.sm80``): A = dy ``[N, G, K, Ho*Wo]``, B = x itself for a plain 1x1 GEMM or
gathered from x ``[N, G, C, H, W]`` at the convolution's coordinates, C = dW ``[G, K, C*Y*X]`` (or the
split-K partials), f16 or bf16 in (``mma.sync`` of that type), f32 accumulate, f32 or the input type out.

The recipe (docs/iree-facts.md "The 392 TFLOP/s sm_80 recipe": 392 TFLOP/s on the H100 for the
hand-written kernel it describes): a workgroup tile of ``bm x bn`` with reduction step ``bk``;
``stages`` shared-memory stages filled by ``cp.async`` (16-byte ``.cg`` where aligned), rows padded to
``bk + 8`` elements so that ``ldmatrix``'s eight row addresses fall in distinct banks; warps of
``wm x wn``, each loading its fragments with ``ldmatrix.x4`` (A and B both K-contiguous in shared
memory: ``mma.sync`` row.col) and running ``mma.sync m16n8k16``; the next k16 step's fragments are
loaded before the current step's mma, across k tiles too.

Layout 2 (NHWGC/GKYXC/NHWGK, ``shape.channels_last``): A = dy ``[N*Ho*Wo, G, K]``, B = x
``[N*H*W, G, C]`` (plain) or ``[N, H, W, G, C]`` (gathered), both with 8 channels in 16 bytes. Both
operands are reduction-outer, so no choice of roles spares a transpose: each is copied by 16-byte
``cp.async`` (x zero-filled by ``src-size`` 0 where the tap falls in the padding) into shared memory
stored reduction-major (``[bk, bm + 8]``, ``[bk, bn + 8]``) and read by ``ldmatrix.x4.trans``, which
hands ``mma.sync`` row.col the same fragments as the plain form at the same cost (:func:`_copy_tile_cl`,
:class:`_Lanes` ``trans``).

Layout 4 without a gather (``plan.folded``, :func:`build_folded_kernel_body`; stride 1, outputs as wide as x
in every inner dimension): x bound with its planes flattened ``[N, G, C, H*W]``, the reduction tiled per image;
a k tile copies, per channel of the N tile, one window of the plane by ``cp.async``, and B's tile is written
from the windows at each tap's shift (a register path from shared memory, masked where a shift wraps a row)
before ``ldmatrix`` reads it as above (docs/decisions.md#layout4).

Layers, each a function with one job: :class:`GemmTiling` (the plan's numbers), :func:`_copy_tile`
(global -> shared of one operand; the convolution's address arithmetic in :func:`_element_address`),
:func:`_load_fragments` (shared -> registers), :func:`_warp_mma` (the warp's matrix step),
:func:`_mainloop` (the software pipeline: prologue, steady state), and :func:`_epilogue` (registers ->
global, masked where M or N is ragged).

Merged groups (:func:`build_merged_kernel_body`, ``policies/sm80.py`` "Merged groups"): the same mainloop on the
dense GEMM of ``m`` groups at once; :func:`_merged_epilogue` stores only its block-diagonal entries, into dW's
own ``[G, K, taps * C]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, memref, nvvm, vector

from convbw_mlir.kernels import nvgpu
from convbw_mlir.kernels.ir import Ix, all_of, for_, if_
from convbw_mlir.policies.sm80 import COPY_ELEMENTS as COPY
from convbw_mlir.policies.sm80 import MMA_K, MMA_M, MMA_N, ROW_PAD, WARP, FoldedWindow, GemmShape, GemmTiling

__all__ = ["Fused", "Merged", "build_folded_kernel_body", "build_kernel_body", "build_merged_kernel_body", "grid"]


@dataclass
class _Operand:
    """One operand of the mainloop: its global memref, the workgroup's first row and how many rows are
    real (``extent``), its shared stages, and whether its elements are gathered from a convolution's x."""

    glob: ir.Value
    row0: ir.Value
    smem: ir.Value
    rows: int
    extent: int
    vector: int  # elements a copy moves (8, 4, 2: cp.async; 1: loads, in groups of 8)
    gather: bool = False


def _unravel(ix: Ix, value: ir.Value, sizes: tuple[int, ...]) -> list[ir.Value]:
    """Row-major coordinates of ``value`` in a box of ``sizes`` (any rank; the outermost is not reduced:
    ``value`` is inside the box)."""
    coords, inner = [], 1
    for d in range(len(sizes) - 1, -1, -1):
        at = value if inner == 1 else ix.div(value, inner)
        coords.append(at if d == 0 else ix.rem(at, sizes[d]))
        inner *= sizes[d]
    return coords[::-1]


def _gather_coords(ix: Ix, conv, outs: list[ir.Value], taps: list[ir.Value],
                   valid: list[ir.Value]) -> tuple[list[ir.Value], list[ir.Value]]:  # fmt: skip
    """x's spatial indices ``o * s + f * d - p`` per dimension (output position ``outs``, filter tap
    ``taps``), clamped inside the image, and ``valid`` with the bounds that padding can break."""
    coords = []
    for dim, (o, f) in enumerate(zip(outs, taps)):
        size = conv.in_size[dim]
        at = ix.sub(ix.add(ix.mul(o, conv.stride[dim]), ix.mul(f, conv.dilation[dim])), conv.pad[dim])
        if conv.pad[dim]:  # only padding reaches before the image's start
            valid = [*valid, ix.lt(ix.c(-1), at)]
        last = (conv.out_size[dim] - 1) * conv.stride[dim] + (conv.filter[dim] - 1) * conv.dilation[dim]
        if last - conv.pad[dim] >= size:
            valid = [*valid, ix.lt(at, size)]
        coords.append(ix.clamp(at, size - 1))
    return coords, valid


def _element_address(ix: Ix, shape: GemmShape, op: _Operand, g: ir.Value, row: ir.Value, r: ir.Value,
                     valid: list[ir.Value]) -> tuple[list[ir.Value], ir.Value | None]:  # fmt: skip
    """Indices of element (row, r) of ``op`` in its global memref, clamped inside it, and whether it is real.

    ``r`` is the reduction index ``(image, output position)``; for a gathered B, ``row`` is
    ``c * taps + tap`` (the tap row-major over the filter) and the element is x at ``o * s + f * d - p``
    in each of the 1, 2 or 3 spatial dimensions.
    """
    image = ix.div(r, shape.hw)
    pos = ix.rem(r, shape.hw)
    if not op.gather:
        return [image, g, row, pos], all_of(valid)
    conv = shape.conv
    c, tap = ix.div(row, conv.taps), ix.rem(row, conv.taps)
    coords, valid = _gather_coords(ix, conv, _unravel(ix, pos, conv.out_size), _unravel(ix, tap, conv.filter), valid)
    return [image, g, c, *coords], all_of(valid)


def _copy_tile(ix: Ix, t: GemmTiling, op: _Operand, tid: ir.Value, g: ir.Value, ktile: ir.Value, stage: ir.Value,
               valid: ir.Value | None, shape: GemmShape) -> None:  # fmt: skip
    """This thread's share of k tile ``ktile`` of ``op`` into shared-memory ``stage``.

    Contiguous rows go by ``cp.async`` (16 bytes: ``.cg``, L1 bypassed; 8 or 4 bytes: ``.ca``); an element
    past the reduction, the rows or the image reads nothing and is zero (``src-size`` 0 or a select),
    so the pipeline has no branch. Gathered or odd-sized rows go by loads, eight elements a thread.
    """
    if shape.channels_last:
        _copy_tile_cl(ix, t, op, tid, g, ktile, stage, valid, shape)
        return
    v = op.vector
    group = v if v > 1 else 8
    chunks = t.bk // group
    per_pass = t.threads // chunks  # rows one pass of all threads covers
    row = ix.div(tid, chunks)
    col = ix.mul(ix.rem(tid, chunks), group)
    r0 = ix.add(ix.mul(ktile, t.bk), col)
    rows_ragged = op.extent % op.rows != 0
    reduction = shape.reduction
    elem = ir.MemRefType(op.glob.type).element_type
    for i in range(op.rows // per_pass):
        r_row = ix.add(row, i * per_pass)
        grow = ix.add(op.row0, r_row)
        conds = [] if valid is None else [valid]
        if rows_ragged:
            conds.append(ix.lt(grow, op.extent))
            grow = arith.minsi(grow, ix.c(op.extent - 1))
        if v > 1:
            in_r = [] if reduction % t.bk == 0 else [ix.lt(r0, reduction)]
            r = r0 if not in_r else arith.minsi(r0, ix.c(reduction - v))
            idx, ok = _element_address(ix, shape, op, g, grow, r, conds + in_r)
            count = ix.c(v) if ok is None else arith.select(ok, ix.c(v), ix.c(0))
            nvgpu.async_copy(op.smem, [stage, r_row, col], op.glob, idx, v, count, bypass_l1=v == 8)
            continue
        values = []
        for e in range(group):
            r = ix.add(r0, e)
            in_r = [] if reduction % t.bk == 0 else [ix.lt(r, reduction)]
            if in_r:
                r = arith.minsi(r, ix.c(reduction - 1))
            idx, ok = _element_address(ix, shape, op, g, grow, r, conds + in_r)
            x = memref.load(op.glob, idx)
            values.append(x if ok is None else arith.select(ok, x, arith.constant(elem, 0.0)))
        vec = vector.from_elements(ir.VectorType.get([group], elem), values)
        vector.store(vec, op.smem, [stage, r_row, col])


def _copy_tile_cl(ix: Ix, t: GemmTiling, op: _Operand, tid: ir.Value, g: ir.Value, ktile: ir.Value,
                  stage: ir.Value, valid: ir.Value | None, shape: GemmShape) -> None:  # fmt: skip
    """Channels-last: this thread's ``cp.async`` copies (16 bytes; 8 or 4 where 8 does not divide K or C)
    of k tile ``ktile`` of ``op`` into shared ``[stage, r, row]`` (reduction-major). A thread keeps its
    channels (``row``) across passes; each
    pass of all threads covers ``threads / (rows / v)`` reduction indices. A vector past M or N, the
    reduction, the split or (gathered x) the image reads nothing and is zero (``src-size`` 0).
    """
    v = op.vector
    if v == 1:  # a row not 4-byte aligned (odd K or C): no cp.async reaches it
        _load_tile_cl(ix, t, op, tid, g, ktile, stage, valid, shape)
        return
    chunks = op.rows // v
    per_pass = t.threads // chunks
    col = ix.mul(ix.rem(tid, chunks), v)
    r_first = ix.div(tid, chunks)
    grow = ix.add(op.row0, col)
    conds = [] if valid is None else [valid]
    if op.extent % op.rows:  # ragged M or N: whole vectors are in or out (v divides K and C)
        conds.append(ix.lt(grow, op.extent))
        grow = arith.minsi(grow, ix.c(op.extent - v))
    conv = shape.conv if op.gather else None
    if conv is not None:  # the vector's tap and channel (loop-invariant: hoisted by LLVM)
        channels = shape.channels
        c, tap = ix.rem(grow, channels), ix.div(grow, channels)
        taps = _unravel(ix, tap, conv.filter)
    reduction = shape.reduction
    for i in range(t.bk // per_pass):
        r_local = ix.add(r_first, i * per_pass)
        r = ix.add(ix.mul(ktile, t.bk), r_local)
        ok = list(conds)
        if reduction % t.bk:
            ok.append(ix.lt(r, reduction))
            r = arith.minsi(r, ix.c(reduction - 1))
        if conv is None:
            idx = [r, g, grow]
        else:
            image, pos = ix.div(r, shape.hw), ix.rem(r, shape.hw)
            coords, ok = _gather_coords(ix, conv, _unravel(ix, pos, conv.out_size), taps, ok)
            idx = [image, *coords, g, c]
        cond = all_of(ok)
        count = ix.c(v) if cond is None else arith.select(cond, ix.c(v), ix.c(0))
        nvgpu.async_copy(op.smem, [stage, r_local, col], op.glob, idx, v, count, bypass_l1=v == COPY)


def _load_tile_cl(ix: Ix, t: GemmTiling, op: _Operand, tid: ir.Value, g: ir.Value, ktile: ir.Value,
                  stage: ir.Value, valid: ir.Value | None, shape: GemmShape) -> None:  # fmt: skip
    """Channels-last with odd K or C (rows 2-byte aligned only): the register path. A thread loads
    :data:`COPY` consecutive elements of one reduction index (masked element loads, zero where a copy
    would have zero-filled) and stores them to shared memory as one 16-byte vector, in the layout
    ``cp.async`` fills (``[stage, r, row]``), so ``ldmatrix`` and the pipeline are unchanged. The stores are
    synchronous: the stage is free since the barrier that ended its last reads, and the barrier before
    its own reads publishes them."""
    chunks = op.rows // COPY
    per_pass = t.threads // chunks
    col = ix.mul(ix.rem(tid, chunks), COPY)
    r_first = ix.div(tid, chunks)
    elem = ir.MemRefType(op.glob.type).element_type
    conds = [] if valid is None else [valid]
    rows = []  # per element: its row (channel, or tap and channel), its own bound where M or N is ragged
    for e in range(COPY):
        grow = ix.add(ix.add(op.row0, col), e)
        ok = []
        if op.extent % COPY or op.extent % op.rows:
            ok.append(ix.lt(grow, op.extent))
            grow = arith.minsi(grow, ix.c(op.extent - 1))
        if op.gather:  # the element's tap and channel (loop-invariant: hoisted by LLVM)
            channels = shape.channels
            rows.append((ix.rem(grow, channels), _unravel(ix, ix.div(grow, channels), shape.conv.filter), ok))
        else:
            rows.append((grow, None, ok))
    zero = arith.constant(elem, 0.0)
    reduction = shape.reduction
    for i in range(t.bk // per_pass):
        r_local = ix.add(r_first, i * per_pass)
        r = ix.add(ix.mul(ktile, t.bk), r_local)
        ok_r = list(conds)
        if reduction % t.bk:
            ok_r.append(ix.lt(r, reduction))
            r = arith.minsi(r, ix.c(reduction - 1))
        if op.gather:
            image, pos = ix.div(r, shape.hw), ix.rem(r, shape.hw)
            outs = _unravel(ix, pos, shape.conv.out_size)
        values = []
        for channel, taps, ok_e in rows:
            ok = ok_r + ok_e
            if op.gather:
                coords, ok = _gather_coords(ix, shape.conv, outs, taps, ok)
                idx = [image, *coords, g, channel]
            else:
                idx = [r, g, channel]
            x = memref.load(op.glob, idx)
            cond = all_of(ok)
            values.append(x if cond is None else arith.select(cond, x, zero))
        vec = vector.from_elements(ir.VectorType.get([COPY], elem), values)
        vector.store(vec, op.smem, [stage, r_local, col])


@dataclass(frozen=True)
class _Skip:
    """Merged groups: warp-uniform, loop-invariant conditions under which a warp runs each ``mma.sync`` (one per
    accumulator, row-major by m tile) and makes each B ``ldmatrix.x4`` (one per pair of n tiles); None: always."""

    mma: list[ir.Value | None]
    b: list[ir.Value | None]


@dataclass
class _Lanes:
    """Per-lane ``ldmatrix`` row addresses, computed once (Figure "ldmatrix" of the PTX ISA)."""

    a_row: ir.Value  # lanes 0-15 rows 0-15 at k 0, lanes 16-31 the same rows at k 8
    a_col: ir.Value
    b_row: ir.Value  # matrices (n 0-7, k 0), (n 0-7, k 8), (n 8-15, k 0), (n 8-15, k 8)
    b_col: ir.Value
    trans: bool = False  # channels-last: shared tiles are [k, m] and [k, n]; rows are k, columns m or n


def _lanes(ix: Ix, lane: ir.Value, trans: bool) -> _Lanes:
    """Each lane's ``ldmatrix.x4`` row: lanes 8q..8q+7 address matrix q's 8 rows.

    Plain (rows m or n, k contiguous): A's matrices (m 0-7, k 0), (m 8-15, k 0), (m 0-7, k 8), (m 8-15, k 8).
    ``trans`` (rows k, m or n contiguous): the same matrices, each stored as 8 k rows of 8 columns; the
    ``.trans`` load gives lane l the pair (k 2(l%4), +1) at column l/4, which is the plain form's
    fragment. A: row k = l%8 + 8(l/16), column m = 8((l/8)%2); B: row k = l%8 + 8((l/8)%2), column
    n = 8(l/16).
    """
    if not trans:
        return _Lanes(
            a_row=ix.rem(lane, 16),
            a_col=ix.mul(ix.div(lane, 16), 8),
            b_row=ix.add(ix.rem(lane, 8), ix.mul(ix.div(lane, 16), 8)),
            b_col=ix.mul(ix.rem(ix.div(lane, 8), 2), 8),
        )
    eighth, half = ix.rem(lane, 8), ix.mul(ix.rem(ix.div(lane, 8), 2), 8)
    sixteenth = ix.mul(ix.div(lane, 16), 8)
    return _Lanes(a_row=ix.add(eighth, sixteenth), a_col=half, b_row=ix.add(eighth, half), b_col=sixteenth,
                  trans=True)  # fmt: skip


def _load_fragments(ix: Ix, t: GemmTiling, lanes: _Lanes, a_smem: ir.Value, b_smem: ir.Value, stage: ir.Value,
                    warp_m: ir.Value, warp_n: ir.Value, step: int, f16: ir.Type,
                    skip: _Skip | None = None) -> list[ir.Value]:  # fmt: skip
    """The warp's A and B fragments of k16 step ``step``: ``wm/16`` A x4 loads, ``wn/16`` B x4 loads (``skip``:
    a B load none of whose ``mma.sync`` runs is not made; its fragment is zero)."""
    k = step * MMA_K
    if lanes.trans:  # [stage, k, m] and [stage, k, n]
        a_k, b_k = ix.add(lanes.a_row, k), ix.add(lanes.b_row, k)
        frags = []
        for i in range(t.wm // MMA_M):
            m = ix.add(ix.add(warp_m, lanes.a_col), i * MMA_M)
            frags.append(nvgpu.ldmatrix(a_smem, [stage, a_k, m], 4, f16, transpose=True))
        for j in range(t.wn // (2 * MMA_N)):
            n = ix.add(ix.add(warp_n, lanes.b_col), j * 2 * MMA_N)
            cond = None if skip is None else skip.b[j]
            if cond is None:
                frags.append(nvgpu.ldmatrix(b_smem, [stage, b_k, n], 4, f16, transpose=True))
                continue
            frag = ir.VectorType.get([4, 2], f16)
            with if_(cond, [frag]) as branch:
                branch.yield_(nvgpu.ldmatrix(b_smem, [stage, b_k, n], 4, f16, transpose=True))
            with branch.otherwise():
                zero = ir.DenseElementsAttr.get_splat(frag, ir.FloatAttr.get(f16, 0.0))
                branch.yield_(arith.constant(frag, zero))
            frags.append(branch.results[0])
        return frags
    a_col = ix.add(lanes.a_col, k)
    b_col = ix.add(lanes.b_col, k)
    frags = []
    for i in range(t.wm // MMA_M):
        frags.append(nvgpu.ldmatrix(a_smem, [stage, ix.add(ix.add(warp_m, lanes.a_row), i * MMA_M), a_col], 4, f16))
    for j in range(t.wn // (2 * MMA_N)):
        row = ix.add(ix.add(warp_n, lanes.b_row), j * 2 * MMA_N)
        frags.append(nvgpu.ldmatrix(b_smem, [stage, row, b_col], 4, f16))
    return frags


def _warp_mma(t: GemmTiling, frags: list[ir.Value], acc: list[ir.Value], f16: ir.Type,
              skip: _Skip | None = None) -> list[ir.Value]:  # fmt: skip
    """One k16 step of the warp: ``(wm/16) x (wn/8)`` ``mma.sync`` on the accumulators (row-major by m tile);
    ``skip`` (merged groups): each runs only under its condition."""
    tiles_m = t.wm // MMA_M
    a, b = frags[:tiles_m], frags[tiles_m:]
    half = ir.VectorType.get([2, 2], f16)
    bs = [vector.extract_strided_slice(half, bf, [h * 2, 0], [2, 2], [1, 1]) for bf in b for h in range(2)]
    tiles_n = t.wn // MMA_N
    out = []
    for i in range(tiles_m):
        for j in range(tiles_n):
            k = i * tiles_n + j
            cond = None if skip is None else skip.mma[k]
            if cond is None:
                out.append(nvgpu.mma_sync(a[i], bs[j], acc[k]))
                continue
            with if_(cond, [acc[k].type]) as branch:
                branch.yield_(nvgpu.mma_sync(a[i], bs[j], acc[k]))
            with branch.otherwise():
                branch.yield_(acc[k])
            out.append(branch.results[0])
    return out


def _mainloop(ix: Ix, t: GemmTiling, shape: GemmShape, a: _Operand, b: _Operand, lanes: _Lanes, tid: ir.Value,
              g: ir.Value, base: ir.Value, warp_m: ir.Value, warp_n: ir.Value, acc: list[ir.Value],
              f16: ir.Type, skip: _Skip | None = None) -> list[ir.Value]:  # fmt: skip
    """The software pipeline over this split's k tiles (``base`` is its first); returns the accumulators.

    Prologue: tiles 0 .. stages-2 in flight, tile 0's first fragments loaded. Iteration ``kt``, k16 step
    ``s``: at s = 0 tile ``kt + stages - 1`` is issued into the stage tile ``kt - 1`` left (every warp
    passed the barrier after its last read); before each step's mma the next step's fragments are
    loaded, at the last step those of tile ``kt + 1``, after waiting for its copies and a barrier.
    One commit group per tile, empty ones included, keeps ``wait_group(stages - 2)`` exact.
    """
    ktiles = -(-shape.reduction // t.bk)
    per_split = -(-ktiles // shape.splits)
    exact = per_split * shape.splits == ktiles  # every split's every tile is real

    def issue(local: ir.Value | int, stage: ir.Value) -> None:
        """Copies of this split's tile ``local`` (zero-filled past the split's or the reduction's end)."""
        valid = None
        if isinstance(local, int):
            tile = ix.add(base, min(local, per_split - 1))
            if local >= per_split:
                valid = arith.constant(ir.IntegerType.get_signless(1), 0)
        else:
            valid = ix.lt(local, per_split)
            tile = ix.add(base, arith.minsi(local, ix.c(per_split - 1)))
        if not exact:
            real = ix.lt(tile, ktiles)
            valid = real if valid is None else arith.andi(valid, real)
            tile = arith.minsi(tile, ix.c(ktiles - 1))  # in bounds even where nothing is read
        for op in (a, b):
            _copy_tile(ix, t, op, tid, g, tile, stage, valid, shape)
        nvvm.cp_async_commit_group()

    return _pipeline(ix, t, lanes, a, b, warp_m, warp_n, acc, f16, per_split, issue, skip)


def _pipeline(ix: Ix, t: GemmTiling, lanes: _Lanes, a: _Operand, b: _Operand, warp_m: ir.Value, warp_n: ir.Value,
              acc: list[ir.Value], f16: ir.Type, count: int | ir.Value,
              issue: Callable[[int | ir.Value, ir.Value], None],
              skip: _Skip | None = None) -> list[ir.Value]:  # fmt: skip
    """The software pipeline over ``count`` k tiles whose copies ``issue(local tile, stage)`` commits (one
    group a tile, zero-filled past the end): :func:`_mainloop`'s and StreamK's segments' (``skip``: merged
    groups' :class:`_Skip`)."""
    steps = t.bk // MMA_K
    for s in range(t.stages - 1):
        issue(s, ix.c(s))
    nvvm.cp_async_wait_group(t.stages - 2)
    gpu.barrier()
    first = _load_fragments(ix, t, lanes, a.smem, b.smem, ix.c(0), warp_m, warp_n, 0, f16, skip)
    with for_(ix.c(0), ix.v(count), ix.c(1), [*acc, *first]) as loop:
        kt = loop.iv
        acc, cur = loop.args[: len(acc)], loop.args[len(acc) :]
        stage = ix.rem(kt, t.stages)
        for s in range(steps):
            if s == 0:
                ahead = ix.add(kt, t.stages - 1)
                issue(ahead, ix.rem(ahead, t.stages))
            if s + 1 < steps:
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, stage, warp_m, warp_n, s + 1, f16, skip)
            else:
                # Tile kt+1 is complete once at most stages-2 newer groups are pending.
                nvvm.cp_async_wait_group(t.stages - 2)
                gpu.barrier()
                next_stage = ix.rem(ix.add(kt, 1), t.stages)
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, next_stage, warp_m, warp_n, 0, f16, skip)
            acc = _warp_mma(t, cur, acc, f16, skip)
            cur = nxt
        loop.yield_(*acc, *cur)
    nvvm.cp_async_wait_group(0)  # no copy may outlive the kernel's shared memory
    return loop.results[: len(acc)]


@dataclass(frozen=True)
class Fused:
    """The problem's epilogue in the kernel's store: ``dW = alpha * acc (+ beta * D)`` in f32, then dW's type
    (docs/epilogues.md); ``d`` is D's memref ``[groups, m, n]`` (dW's own order), None for scale."""

    alpha: float
    beta: float
    d: ir.Value | None = None


def _store(value: Callable[[], ir.Value], c: ir.Value, indices: list[ir.Value], cond: ir.Value | None) -> None:
    """Store ``value()`` (built where the store runs: D is read only where dW is written) unless ``cond`` is false."""
    if cond is None:
        vector.store(value(), c, indices)
        return
    with if_(cond):
        vector.store(value(), c, indices)


def _finish(acc: ir.Value, out: ir.Type, fused: Fused | None, d_at: list[ir.Value]) -> ir.Value:
    """f32 accumulators ``vector<n x f32>`` -> dW's values: the epilogue (``fused``, D read at ``d_at``) in
    f32, then rounded once to ``out``."""
    f32 = ir.F32Type.get()
    vt = ir.VectorType(acc.type)
    if fused is not None:
        splat = ir.DenseElementsAttr.get_splat

        def const(x: float) -> ir.Value:
            return arith.constant(vt, splat(vt, ir.FloatAttr.get_f32(x)))

        if fused.alpha != 1.0:
            acc = arith.mulf(acc, const(fused.alpha))
        if fused.d is not None:
            d_elem = ir.MemRefType(fused.d.type).element_type
            d = vector.load(ir.VectorType.get(vt.shape, d_elem), fused.d, d_at)
            if d_elem != f32:
                d = arith.extf(vt, d)
            acc = arith.addf(acc, d if fused.beta == 1.0 else arith.mulf(d, const(fused.beta)))
    return acc if out == f32 else arith.truncf(ir.VectorType.get(vt.shape, out), acc)


def _epilogue(ix: Ix, t: GemmTiling, shape: GemmShape, c: ir.Value, where: list[ir.Value], row0: ir.Value,
              col0: ir.Value, lane: ir.Value, acc: list[ir.Value], out: ir.Type,
              fused: Fused | None = None) -> None:  # fmt: skip
    """Store the accumulators: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) .. +1 of each 16x8 tile.

    ``where`` indexes ``c`` before (row, column): ``[g]``, or ``[split, g]`` for split-K partials. Rows and
    columns past M and N are not stored; with N odd a pair is stored one element at a time. ``fused``
    (unsplit only: ``where`` is ``[g]``): the epilogue, applied to each pair where it is stored.
    """
    row = ix.add(row0, ix.div(lane, 4))
    col = ix.add(col0, ix.mul(ix.rem(lane, 4), 2))
    tiles_n = t.wn // MMA_N
    ragged_m, ragged_n, odd_n = shape.m % t.bm != 0, shape.n % t.bn != 0, shape.n % 2 != 0
    f32x1 = ir.VectorType.get([1], ir.F32Type.get())
    for i in range(t.wm // MMA_M):
        for j in range(tiles_n):
            for h in range(2):
                pair = vector.extract(acc[i * tiles_n + j], [], [h])
                r = ix.add(row, i * MMA_M + h * 8)
                cc = ix.add(col, j * MMA_N)
                row_ok = [ix.lt(r, shape.m)] if ragged_m else []
                if not odd_n:
                    at = [*where, r, cc]
                    _store(lambda p=pair, at=at: _finish(p, out, fused, at), c, at,
                           all_of(row_ok + ([ix.lt(cc, shape.n)] if ragged_n else [])))  # fmt: skip
                    continue
                for e in range(2):
                    one = vector.extract_strided_slice(f32x1, pair, [e], [1], [1])
                    at = [*where, r, ix.add(cc, e)]
                    _store(lambda p=one, at=at: _finish(p, out, fused, at), c, at,
                           all_of([*row_ok, ix.lt(at[-1], shape.n)]))  # fmt: skip


def _threads(ix: Ix, t: GemmTiling) -> tuple[ir.Value, ...]:
    """(thread id, lane, warp, the warp tile's first row and column in the workgroup tile)."""
    tid = gpu.thread_id(gpu.Dimension.x)
    lane = ix.rem(tid, WARP)
    warp = ix.div(tid, WARP)
    warps_n = t.bn // t.wn
    warp_m = ix.mul(ix.div(warp, warps_n), t.wm)
    warp_n = ix.mul(ix.rem(warp, warps_n), t.wn)
    return tid, lane, warp, warp_m, warp_n


def _workgroup(ix: Ix, t: GemmTiling, shape: GemmShape) -> tuple[Any, ...]:
    """(the workgroup tile's first row and column of dW, its group, where its results go: ``[group]`` or
    ``[split, group]``, its split's first k tile), from the grid of :func:`grid`."""
    block_n = ix.mul(gpu.block_id(gpu.Dimension.x), t.bn)
    block_m = ix.mul(gpu.block_id(gpu.Dimension.y), t.bm)
    z = gpu.block_id(gpu.Dimension.z)
    if shape.splits == 1:
        g, where, base = z, [z], ix.c(0)
    else:
        g, split = ix.rem(z, shape.groups), ix.div(z, shape.groups)
        ktiles = -(-shape.reduction // t.bk)
        where, base = [split, g], ix.mul(split, -(-ktiles // shape.splits))
    return block_m, block_n, g, where, base


def _begin(entry: ir.Block, a: ir.Value, c: ir.Value, t: GemmTiling) -> _Body:
    """What every kernel body starts from (:func:`build_kernel_body`, the merged and the folded ones)."""
    ix = Ix(entry)
    tid, lane, _, warp_m, warp_n = _threads(ix, t)
    f32x2x2 = ir.VectorType.get([2, 2], ir.F32Type.get())
    zero = arith.constant(f32x2x2, ir.DenseElementsAttr.get_splat(f32x2x2, ir.FloatAttr.get_f32(0.0)))
    elem = ir.MemRefType(a.type).element_type  # f16 or bf16: 16-bit elements copy and load alike
    acc = [zero] * ((t.wm // MMA_M) * (t.wn // MMA_N))
    return _Body(ix, elem, ir.MemRefType(c.type).element_type, tid, lane, warp_m, warp_n, acc)


@dataclass(frozen=True)
class _Body:
    """A kernel body's start: index helper, input and output element types, this thread's ids, zero accumulators."""

    ix: Ix
    elem: ir.Type
    out: ir.Type
    tid: ir.Value
    lane: ir.Value
    warp_m: ir.Value
    warp_n: ir.Value
    acc: list[ir.Value]

    def shared(self, shape: list[int]) -> ir.Value:
        """A workgroup (shared memory) buffer of the input element type."""
        space = ir.Attribute.parse("#gpu.address_space<workgroup>")
        return memref.alloc(ir.MemRefType.get(shape, self.elem, memory_space=space), [], [])


def grid(shape: GemmShape, t: GemmTiling) -> tuple[int, int, int]:
    """Workgroups: N tiles, M tiles, groups x splits."""
    return -(-shape.n // t.bn), -(-shape.m // t.bm), shape.groups * shape.splits


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape, t: GemmTiling,
                      fused: Fused | None = None) -> None:  # fmt: skip
    """Emit the kernel into ``entry`` (its operands already bound), for the grid :func:`grid` gives.

    Args:
        a: dy, ``memref<images x groups x m x hw x f16>``; channels-last ``memref<(images*hw) x groups x m>``.
        b: x, ``memref<images x groups x n x hw x f16>`` (a plain GEMM) or
            ``memref<images x groups x channels x H x W x f16>`` (gathered, ``shape.conv``); channels-last
            ``memref<(images*hw) x groups x n>`` or ``memref<images x H x W x groups x channels>``.
        c: dW, ``memref<groups x m x n x (f32|f16)>``; with split-K, the partials
            ``memref<splits x groups x m x n x f32>``.
        fused: the problem's epilogue in the store (unsplit kernels; a split's sum applies it otherwise).
    """
    k = _begin(entry, a, c, t)
    ix = k.ix
    block_m, block_n, g, where, base = _workgroup(ix, t, shape)
    if shape.channels_last:  # reduction-major, rows padded by 8 (16 bytes): ldmatrix's 8 rows hit distinct banks
        a_tile, b_tile = [t.stages, t.bk, t.bm + ROW_PAD], [t.stages, t.bk, t.bn + ROW_PAD]
    else:
        a_tile, b_tile = [t.stages, t.bm, t.row], [t.stages, t.bn, t.row]
    lanes = _lanes(ix, k.lane, shape.channels_last)
    a_op = _Operand(a, block_m, k.shared(a_tile), t.bm, shape.m, shape.a_vector())
    b_op = _Operand(b, block_n, k.shared(b_tile), t.bn, shape.n, shape.b_vector(), gather=shape.conv is not None)
    acc = _mainloop(ix, t, shape, a_op, b_op, lanes, k.tid, g, base, k.warp_m, k.warp_n, k.acc, k.elem)
    row0, col0 = ix.add(block_m, k.warp_m), ix.add(block_n, k.warp_n)
    _epilogue(ix, t, shape, c, where, row0, col0, k.lane, acc, k.out, fused)


# -- merged groups ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Merged:
    """``groups`` consecutive groups of ``out_channels`` (K) and ``in_channels`` (C) each in one dense GEMM
    (M = groups * K, N = taps * groups * C, ``j = tap * groups * C + c``)."""

    groups: int
    out_channels: int
    in_channels: int
    skip: bool = False  # skip the mma.sync tiles (and B loads) whose rows and columns share no group


def _diagonal_tiles(ix: Ix, t: GemmTiling, shape: GemmShape, merge: Merged, row0: ir.Value,
                    col0: ir.Value) -> _Skip:  # fmt: skip
    """Per accumulator of the warp (its tile's first row ``row0`` and column ``col0``): whether its 16x8 block
    meets the block diagonal, i.e. its rows' groups ``[r / K, (r + 15) / K]`` and its columns' groups
    ``[c / C, (c + 7) / C]`` (``c`` the channel within the tap) overlap; per B load, whether one of its two
    n tiles' blocks does. Warp-uniform and loop-invariant; None (always) where 8 columns may cross a tap
    (``m * C`` not a multiple of 8)."""
    kg, cg, wide = merge.out_channels, merge.in_channels, merge.groups * merge.in_channels
    tiles_m, tiles_n = t.wm // MMA_M, t.wn // MMA_N
    if wide % MMA_N:
        return _Skip([None] * (tiles_m * tiles_n), [None] * (tiles_n // 2))
    le = lambda a, b: arith.cmpi(arith.CmpIPredicate.ule, a, b)  # noqa: E731
    needed = []
    for i in range(t.wm // MMA_M):
        r = ix.add(row0, i * MMA_M)
        r_lo, r_hi = ix.div(r, kg), ix.div(ix.add(r, MMA_M - 1), kg)
        for j in range(tiles_n):
            c = ix.rem(ix.add(col0, j * MMA_N), wide)
            c_lo, c_hi = ix.div(c, cg), ix.div(ix.add(c, MMA_N - 1), cg)
            needed.append(arith.andi(le(c_lo, r_hi), le(r_lo, c_hi)))
    loads = []
    for q in range(tiles_n // 2):  # B load q feeds n tiles 2q and 2q + 1 of every m tile
        conds = [needed[i * tiles_n + j] for i in range(tiles_m) for j in (2 * q, 2 * q + 1)]
        any_ = conds[0]
        for c in conds[1:]:
            any_ = arith.ori(any_, c)
        loads.append(any_)
    return _Skip(needed, loads)


def _merged_epilogue(ix: Ix, t: GemmTiling, shape: GemmShape, merge: Merged, c: ir.Value, where: list[ir.Value],
                     row0: ir.Value, col0: ir.Value, lane: ir.Value, acc: list[ir.Value], out: ir.Type,
                     fused: Fused | None = None) -> None:  # fmt: skip
    """:func:`_epilogue` of a merged GEMM: entry (r, j) is dW[g * m + r // K, r % K, tap * C + c % C] where its
    group ``r // K`` is ``c // C`` (``c`` = ``j % (m * C)``, tap = ``j / (m * C)``); the other entries are
    another group's x against this one's dy, and are dropped. ``where`` ends with the merged group ``g``
    (``[g]`` or ``[split, g]``); ``c`` is dW ``[G, K, taps * C]`` or its split partials. Pairs share a group
    and a tap where C is even; else each element is stored alone."""
    kg, cg, wide = merge.out_channels, merge.in_channels, merge.groups * merge.in_channels
    first_group = ix.mul(where[-1], merge.groups)
    row = ix.add(row0, ix.div(lane, 4))
    col = ix.add(col0, ix.mul(ix.rem(lane, 4), 2))
    tiles_n = t.wn // MMA_N
    ragged_m, ragged_n = shape.m % t.bm != 0, shape.n % t.bn != 0
    width = 2 if cg % 2 == 0 else 1  # a pair (columns 2q, 2q+1) stays in one group of one tap
    vec = ir.VectorType.get([width], ir.F32Type.get())
    for i in range(t.wm // MMA_M):
        for h in range(2):
            r = ix.add(row, i * MMA_M + h * 8)
            group, k = ix.div(r, kg), ix.rem(r, kg)
            row_ok = [ix.lt(r, shape.m)] if ragged_m else []
            for j in range(tiles_n):
                pair = vector.extract(acc[i * tiles_n + j], [], [h])
                for e in range(0, 2, width):
                    part = pair if width == 2 else vector.extract_strided_slice(vec, pair, [e], [1], [1])
                    cc = ix.add(col, j * MMA_N + e)
                    tap, cm = ix.div(cc, wide), ix.rem(cc, wide)
                    diagonal = _on_diagonal(ix, cm, cg, group)
                    at = [*where[:-1], ix.add(first_group, group), k, ix.add(ix.mul(tap, cg), ix.rem(cm, cg))]
                    ok = [*row_ok, *([ix.lt(cc, shape.n)] if ragged_n else []), diagonal]
                    _store(lambda p=part, at=at: _finish(p, out, fused, at), c, at, all_of(ok))


def _on_diagonal(ix: Ix, channel: ir.Value, in_channels: int, group: ir.Value) -> ir.Value:
    """Whether merged column ``channel`` (within its tap) is an in channel of the row's ``group``."""
    return arith.cmpi(arith.CmpIPredicate.eq, ix.div(channel, in_channels), group)


def build_merged_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape,
                             t: GemmTiling, merge: Merged, fused: Fused | None = None) -> None:  # fmt: skip
    """:func:`build_kernel_body` of a merged GEMM (channels-last): ``shape`` is the dense GEMM of ``merge.groups``
    groups at once (``a`` dy ``[R, G / m, m * K]``, ``b`` x ``[R, G / m, m * C]`` or ``[N, H, W, G / m, m * C]``);
    ``c`` is dW ``[G, K, taps * C]`` (or ``[splits, G, K, taps * C]`` f32), written by :func:`_merged_epilogue`."""
    k = _begin(entry, a, c, t)
    ix = k.ix
    block_m, block_n, g, where, base = _workgroup(ix, t, shape)
    a_tile, b_tile = [t.stages, t.bk, t.bm + ROW_PAD], [t.stages, t.bk, t.bn + ROW_PAD]  # reduction-major
    lanes = _lanes(ix, k.lane, True)
    a_op = _Operand(a, block_m, k.shared(a_tile), t.bm, shape.m, shape.a_vector())
    b_op = _Operand(b, block_n, k.shared(b_tile), t.bn, shape.n, shape.b_vector(), gather=shape.conv is not None)
    row0, col0 = ix.add(block_m, k.warp_m), ix.add(block_n, k.warp_n)
    skip = _diagonal_tiles(ix, t, shape, merge, row0, col0) if merge.skip else None
    acc = _mainloop(ix, t, shape, a_op, b_op, lanes, k.tid, g, base, k.warp_m, k.warp_n, k.acc, k.elem, skip)
    _merged_epilogue(ix, t, shape, merge, c, where, row0, col0, k.lane, acc, k.out, fused)


# -- layout 4 without a gather: x's windows by cp.async, the taps' shifts applied in shared memory -------------
def _copy_a_image(ix: Ix, t: GemmTiling, op: _Operand, tid: ir.Value, g: ir.Value, image: ir.Value,
                  pos0: ir.Value, stage: ir.Value, valid: ir.Value | None, hw: int) -> None:  # fmt: skip
    """dy's k tile of one image (positions ``pos0 .. pos0 + bk``, zero past the plane) by ``cp.async``."""
    v = op.vector
    chunks = t.bk // v
    per_pass = t.threads // chunks
    row, col = ix.div(tid, chunks), ix.mul(ix.rem(tid, chunks), v)
    pos = ix.add(pos0, col)
    conds = [] if valid is None else [valid]
    if hw % t.bk:
        conds.append(ix.lt(pos, hw))
        pos = arith.minsi(pos, ix.c(hw - v))
    for i in range(op.rows // per_pass):
        r_row = ix.add(row, i * per_pass)
        grow = ix.add(op.row0, r_row)
        ok = list(conds)
        if op.extent % op.rows:
            ok.append(ix.lt(grow, op.extent))
            grow = arith.minsi(grow, ix.c(op.extent - 1))
        cond = all_of(ok)
        count = ix.c(v) if cond is None else arith.select(cond, ix.c(v), ix.c(0))
        nvgpu.async_copy(op.smem, [stage, r_row, col], op.glob, [image, g, grow, pos], v, count, bypass_l1=v == COPY)


def _copy_windows(ix: Ix, t: GemmTiling, w: FoldedWindow, x: ir.Value, w_smem: ir.Value, tid: ir.Value,
                  g: ir.Value, c_first: ir.Value, image: ir.Value, pos0: ir.Value, stage: ir.Value,
                  valid: ir.Value | None, channels: int, hw_in: int) -> None:  # fmt: skip
    """x's windows of the tile: per channel from ``c_first``, ``w.length`` elements of the plane from
    ``pos0 + min_shift`` aligned down to ``w.vector``, by ``cp.async`` (zero outside the plane and past C)."""
    v = w.vector
    per_row = w.length // v
    total = w.channels * per_row
    start = w.min_shift - w.min_shift % v  # the window's first element, from pos0 (pos0 is a multiple of v)
    for i in range(-(-total // t.threads)):
        at = ix.add(tid, i * t.threads)
        ok = [] if valid is None else [valid]
        if total % t.threads:
            ok.append(ix.lt(at, total))
            at = arith.minsi(at, ix.c(total - 1))
        ch, k = ix.div(at, per_row), ix.rem(at, per_row)
        c = ix.add(c_first, ch)
        flat = ix.add(ix.add(pos0, start), ix.mul(k, v))
        ok += [ix.lt(c, channels), ix.lt(ix.c(-1), flat), ix.lt(flat, hw_in)]
        idx = [image, g, arith.minsi(c, ix.c(channels - 1)), ix.clamp(flat, hw_in - v)]
        count = arith.select(all_of(ok), ix.c(v), ix.c(0))
        nvgpu.async_copy(w_smem, [stage, ch, ix.mul(k, v)], x, idx, v, count, bypass_l1=v == COPY)


def _expand_windows(ix: Ix, t: GemmTiling, shape: GemmShape, w: FoldedWindow, w_smem: ir.Value,
                    b_smem: ir.Value, tid: ir.Value, block_n: ir.Value, c_first: ir.Value, pos0: ir.Value,
                    stage: ir.Value) -> None:  # fmt: skip
    """B's k tile from the windows: row ``j = (c, tap)``, column ``pos`` is window ``c`` at ``pos + shift(tap)``,
    zero where an inner coordinate leaves x (the flattened shift wraps into the next row there) or past the
    plane, M or N. Eight elements a thread loaded from shared memory, stored as one 16-byte vector in the layout
    ``ldmatrix`` reads (``[stage, j, pos]``)."""
    conv = shape.conv
    chunks = t.bk // COPY
    per_pass = t.threads // chunks
    row, col = ix.div(tid, chunks), ix.mul(ix.rem(tid, chunks), COPY)
    elem = ir.MemRefType(w_smem.type).element_type
    zero = arith.constant(elem, 0.0)
    base = w.min_shift % w.vector - w.min_shift  # window index of pos0 + shift, less the shift
    strides = [1] * len(conv.in_size)
    for d in range(len(conv.in_size) - 2, -1, -1):
        strides[d] = strides[d + 1] * conv.in_size[d + 1]
    positions = []  # per element: (its window column less the shift, its inner output coordinates, its bounds)
    for e in range(COPY):
        pos = ix.add(ix.add(pos0, col), e)
        ok = []
        if shape.hw % t.bk:
            ok.append(ix.lt(pos, shape.hw))
            pos = arith.minsi(pos, ix.c(shape.hw - 1))
        positions.append((ix.add(col, e + base), _unravel(ix, pos, conv.out_size)[1:], ok))
    for i in range(t.bn // per_pass):
        jl = ix.add(row, i * per_pass)
        j = ix.add(block_n, jl)
        ok_j = []
        if shape.n % t.bn:
            ok_j.append(ix.lt(j, shape.n))
            j = arith.minsi(j, ix.c(shape.n - 1))
        c_local = ix.sub(ix.div(j, conv.taps), c_first)
        taps = _unravel(ix, ix.rem(j, conv.taps), conv.filter)
        shift = None
        inner = []  # per inner dimension: the tap's offset f * d - p
        for d, f in enumerate(taps):
            off = ix.sub(ix.mul(f, conv.dilation[d]), conv.pad[d])
            term = ix.mul(off, strides[d]) if strides[d] != 1 else off
            shift = term if shift is None else arith.addi(shift, term)
            if d:
                inner.append((off, conv.in_size[d]))
        shift = ix.add(shift, 0)
        values = []
        for column, outs, ok_e in positions:
            ok = ok_j + ok_e
            for (off, size), o in zip(inner, outs):
                at = arith.addi(o, off)
                ok += [ix.lt(ix.c(-1), at), ix.lt(at, size)]
            x = memref.load(w_smem, [stage, c_local, arith.addi(column, shift)])
            values.append(arith.select(all_of(ok), x, zero))
        vector.store(vector.from_elements(ir.VectorType.get([COPY], elem), values), b_smem, [stage, jl, col])


def _pipeline_folded(ix: Ix, t: GemmTiling, lanes: _Lanes, a: _Operand, b: _Operand, warp_m: ir.Value,
                     warp_n: ir.Value, acc: list[ir.Value], f16: ir.Type, count: int,
                     issue: Callable[[int | ir.Value, ir.Value], None],
                     expand: Callable[[int | ir.Value, ir.Value], None]) -> list[ir.Value]:  # fmt: skip
    """:func:`_pipeline` with B built from x's windows: once a tile's copies have landed (the wait and the
    barrier), ``expand(local tile, stage)`` writes its B tile and a second barrier publishes it before its
    first fragments are read."""
    steps = t.bk // MMA_K
    for s in range(t.stages - 1):
        issue(s, ix.c(s))
    nvvm.cp_async_wait_group(t.stages - 2)
    gpu.barrier()
    expand(0, ix.c(0))
    gpu.barrier()
    first = _load_fragments(ix, t, lanes, a.smem, b.smem, ix.c(0), warp_m, warp_n, 0, f16)
    with for_(ix.c(0), ix.v(count), ix.c(1), [*acc, *first]) as loop:
        kt = loop.iv
        acc, cur = loop.args[: len(acc)], loop.args[len(acc) :]
        stage = ix.rem(kt, t.stages)
        for s in range(steps):
            if s == 0:
                ahead = ix.add(kt, t.stages - 1)
                issue(ahead, ix.rem(ahead, t.stages))
            if s + 1 < steps:
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, stage, warp_m, warp_n, s + 1, f16)
            else:
                nvvm.cp_async_wait_group(t.stages - 2)
                gpu.barrier()
                following = ix.add(kt, 1)
                next_stage = ix.rem(following, t.stages)
                expand(following, next_stage)
                gpu.barrier()
                nxt = _load_fragments(ix, t, lanes, a.smem, b.smem, next_stage, warp_m, warp_n, 0, f16)
            acc = _warp_mma(t, cur, acc, f16)
            cur = nxt
        loop.yield_(*acc, *cur)
    nvvm.cp_async_wait_group(0)
    return loop.results[: len(acc)]


def build_folded_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, c: ir.Value, shape: GemmShape,
                             t: GemmTiling, w: FoldedWindow, fused: Fused | None = None) -> None:  # fmt: skip
    """Layout 4's kernel without a gather (the folded form, docs/decisions.md#layout4), for :func:`grid`'s grid.

    The reduction is tiled per image (``ceil(hw / bk)`` k tiles an image, the last one zero past the plane). A
    k tile brings dy's rows and, per channel of the N tile, one window of x's flattened plane (``w``) by
    ``cp.async``; once they land, B's tile is written from the windows at each tap's shift
    (:func:`_expand_windows`) and read by ``ldmatrix`` as in the gathered form.

    Args:
        a: dy, ``memref<images x groups x m x hw>``; b: x, ``memref<images x groups x channels x (H*W)>``;
        c: dW ``memref<groups x m x n>`` or the split-K partials ``memref<splits x groups x m x n x f32>``.
    """
    k = _begin(entry, a, c, t)
    ix, tid, f16 = k.ix, k.tid, k.elem
    block_n = ix.mul(gpu.block_id(gpu.Dimension.x), t.bn)
    block_m = ix.mul(gpu.block_id(gpu.Dimension.y), t.bm)
    z = gpu.block_id(gpu.Dimension.z)
    per_image = -(-shape.hw // t.bk)
    ktiles = shape.images * per_image
    per_split = -(-ktiles // shape.splits)
    exact = per_split * shape.splits == ktiles
    if shape.splits == 1:
        g, where, base = z, [z], ix.c(0)
    else:
        g, split = ix.rem(z, shape.groups), ix.div(z, shape.groups)
        where, base = [split, g], ix.mul(split, per_split)
    smem = [[t.stages, t.bm, t.row], [t.stages, t.bn, t.row], [t.stages, w.channels, w.length]]
    a_smem, b_smem, w_smem = (k.shared(s) for s in smem)
    lanes = _lanes(ix, k.lane, False)
    a_op = _Operand(a, block_m, a_smem, t.bm, shape.m, shape.a_vector())
    b_op = _Operand(b, block_n, b_smem, t.bn, shape.n, COPY)
    c_first = ix.div(block_n, shape.conv.taps)
    channels, hw_in = shape.channels, ir.MemRefType(b.type).shape[-1]

    def tile_of(local: ir.Value | int) -> tuple[ir.Value, ir.Value | None]:
        """This split's tile ``local`` (clamped in bounds) and whether it is real."""
        valid = None
        if isinstance(local, int):
            tile = ix.add(base, min(local, per_split - 1))
            if local >= per_split:
                valid = arith.constant(ir.IntegerType.get_signless(1), 0)
        else:
            valid = ix.lt(local, per_split)
            tile = ix.add(base, arith.minsi(local, ix.c(per_split - 1)))
        if not exact:
            real = ix.lt(tile, ktiles)
            valid = real if valid is None else arith.andi(valid, real)
            tile = arith.minsi(tile, ix.c(ktiles - 1))
        return tile, valid

    def issue(local: ir.Value | int, stage: ir.Value) -> None:
        tile, valid = tile_of(local)
        image, pos0 = ix.div(tile, per_image), ix.mul(ix.rem(tile, per_image), t.bk)
        _copy_a_image(ix, t, a_op, tid, g, image, pos0, stage, valid, shape.hw)
        _copy_windows(ix, t, w, b, w_smem, tid, g, c_first, image, pos0, stage, valid, channels, hw_in)
        nvvm.cp_async_commit_group()

    def expand(local: ir.Value | int, stage: ir.Value) -> None:
        tile, _ = tile_of(local)
        pos0 = ix.mul(ix.rem(tile, per_image), t.bk)
        _expand_windows(ix, t, shape, w, w_smem, b_smem, tid, block_n, c_first, pos0, stage)

    acc = _pipeline_folded(ix, t, lanes, a_op, b_op, k.warp_m, k.warp_n, k.acc, f16, per_split, issue, expand)
    row0, col0 = ix.add(block_m, k.warp_m), ix.add(block_n, k.warp_n)
    _epilogue(ix, t, shape, c, where, row0, col0, k.lane, acc, k.out, fused)
