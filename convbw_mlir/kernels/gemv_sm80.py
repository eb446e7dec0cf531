"""The split-reduction GEMV kernel of the explicit strategy (NVIDIA, CUDA cores), written with the MLIR Python
builders.

``ws[chunk, g, k, t * C + c] = sum over the chunk's positions p of dy[p, g * K + k] * x[n, o * s + t * d - pad,
g * C + c]`` for a channels-last problem whose K or C is small (the numbers and their rule are
``convbw_mlir.policies.gemv``): dy binds as ``[N * prod(out), G * K]``, x flat (``N * prod(in) * G * C``), the
f32 workspace ``ws`` as ``[chunks, G, K, taps * C]``, which a second stage (``linalg.generic``) sums in chunk
order and rounds to dW's type; with one chunk the kernel writes dW ``[G, K, taps * C]`` itself (tiny problems:
no second dispatch).

Layers, each a function with one job: :func:`_thread` (which group, channel blocks, tap run and position lane a
thread owns), :func:`_taps` (its taps' offsets into x, once), :func:`_position` (a position's image, output
coordinates and flat offset into x, masked past the chunk), :func:`_step` (one position: dy's block, each tap's x
vectors, the FMAs), :func:`_positions_loop` (the lane's positions, ``unroll`` an iteration, unmasked where every
tap is inside x; the accumulators carried), :func:`_reduce` (the lanes' sums, in
order, through shared memory, to the workspace).
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, math, memref, scf, vector

from convbw_mlir.kernels.ir import FoldIx, all_of, unravel
from convbw_mlir.policies.gemv import GemvKernel

__all__ = ["build_kernel_body", "grid"]


@dataclass
class _Thread:
    """What one thread owns: its first out channel of dy ``k0`` and in channel of x ``c0`` (group included),
    its tap run ``run``, its group ``g`` and out/in blocks ``kb``/``cb``, its position lane ``lane`` and its slot
    (the index of its (group, blocks, run) among a lane's threads)."""

    k0: ir.Value
    c0: ir.Value
    run: ir.Value
    g: ir.Value
    kb: ir.Value
    cb: ir.Value
    lane: ir.Value
    slot: ir.Value


def _thread(ix: FoldIx, k: GemvKernel, tid: ir.Value) -> _Thread:
    """Threads, fastest first: out block, in block, tap run, group, position lane (the policy's order)."""
    kb = ix.rem(tid, k.k_blocks)
    rest = ix.div(tid, k.k_blocks)
    cb = ix.rem(rest, k.c_blocks)
    rest = ix.div(rest, k.c_blocks)
    run = ix.rem(rest, k.runs)
    rest = ix.div(rest, k.runs)
    g = ix.rem(rest, k.groups)
    k0 = ix.add(ix.mul(g, k.out_channels), ix.mul(kb, k.k_block))
    c0 = ix.add(ix.mul(g, k.in_channels), ix.mul(cb, k.c_block))
    return _Thread(k0, c0, run, g, kb, cb, ix.div(tid, k.slots), ix.rem(tid, k.slots))


@dataclass
class _Tap:
    """One tap of a thread's run: its offsets into x along each dimension, ``f * d - pad``, and its flat offset
    into x (those offsets times x's strides, plus the thread's first channel)."""

    offs: list[ir.Value]
    flat: ir.Value


def _x_strides(k: GemvKernel) -> list[int]:
    """x's element strides (channels-last ``[N, *in, G * C]``): the image's, then each spatial dimension's."""
    strides = [k.groups * k.in_channels]  # the innermost spatial dimension's
    for size in reversed(k.conv.in_size):
        strides.insert(0, strides[0] * size)
    return strides


def _taps(ix: FoldIx, k: GemvKernel, th: _Thread) -> list[_Tap]:
    """The thread's run of taps (a run's taps past the filter's end read its last tap; :func:`_reduce` does not
    store them), computed once before the position loop."""
    conv, last = k.conv, k.filter_taps - 1
    strides = _x_strides(k)[1:]
    out = []
    for i in range(k.taps):
        t = ix.add(ix.mul(th.run, k.taps), i)
        if k.runs * k.taps > k.filter_taps:
            t = arith.minsi(t, ix.c(last))
        fs = unravel(ix, t, conv.filter)
        offs = [ix.sub(ix.mul(f, conv.dilation[d]), conv.pad[d]) for d, f in enumerate(fs)]
        flat = th.c0
        for d, off in enumerate(offs):
            flat = ix.add(flat, ix.mul(off, strides[d]))
        out.append(_Tap(offs, flat))
    return out


@dataclass
class _Where:
    """A position: its index (clamped into the problem), its image and output coordinates, its flat offset into x
    (``image * X_n + sum(o * s * X_d)``), and whether it is inside the chunk and the problem (None: always)."""

    pos: ir.Value
    image: ir.Value
    outs: list[ir.Value]
    base: ir.Value
    inside: ir.Value | None


def _position(ix: FoldIx, k: GemvKernel, step: ir.Value, th: _Thread) -> _Where:
    """The lane's ``step``-th position of its chunk."""
    local = ix.add(ix.mul(step, k.lanes), th.lane)
    pos = ix.add(ix.mul(gpu.block_id(gpu.Dimension.x), k.chunk_positions), local)
    conds = []
    if k.loop_steps * k.unroll * k.lanes != k.chunk_positions:
        conds.append(ix.lt(local, k.chunk_positions))
    if k.chunk_positions * k.chunks != k.positions:
        conds.append(ix.lt(pos, k.positions))
    if conds:
        pos = arith.minsi(pos, ix.c(k.positions - 1))
    image, *outs = unravel(ix, pos, (k.images, *k.conv.out_size))
    strides = _x_strides(k)
    base = ix.mul(image, strides[0])
    for d, o in enumerate(outs):
        base = ix.add(base, ix.mul(o, k.conv.stride[d] * strides[d + 1]))
    return _Where(pos, image, outs, base, all_of(conds))


def _edges(k: GemvKernel) -> list[tuple[int, bool, bool]]:
    """Each spatial dimension where some tap reads outside x: (dimension, below 0, past the end)."""
    conv, out = k.conv, []
    for d in range(len(conv.in_size)):
        last = (conv.out_size[d] - 1) * conv.stride[d] + (conv.filter[d] - 1) * conv.dilation[d] - conv.pad[d]
        low, high = conv.pad[d] > 0, last >= conv.in_size[d]
        if low or high:
            out.append((d, low, high))
    return out


def _interior(ix: FoldIx, k: GemvKernel, where: _Where) -> ir.Value | None:
    """Whether every tap of the filter reads inside x at this position (None: every position does)."""
    conv, conds = k.conv, []
    for d, low, high in _edges(k):
        first = ix.sub(ix.mul(where.outs[d], conv.stride[d]), conv.pad[d])
        if low:
            conds.append(ix.lt(-1, first))
        if high:
            conds.append(ix.lt(ix.add(first, (conv.filter[d] - 1) * conv.dilation[d]), conv.in_size[d]))
    return all_of(conds)


def _load(mem: ir.Value, idx: list[ir.Value], ok: ir.Value | None, v: int, f32: ir.Type) -> ir.Value:
    """``v`` channels at ``idx`` as f32, zero where ``ok`` is false (the address is kept inside)."""
    elem = ir.MemRefType(mem.type).element_type
    val = vector.load(ir.VectorType.get([v], elem), mem, idx)
    if ok is not None:
        zero = arith.constant(val.type, ir.DenseElementsAttr.get_splat(val.type, ir.FloatAttr.get(elem, 0.0)))
        val = arith.select(ok, val, zero)
    return arith.extf(ir.VectorType.get([v], f32), val)


def _step(ix: FoldIx, k: GemvKernel, dy: ir.Value, x: ir.Value, th: _Thread, taps: list[_Tap], where: _Where,
          acc: list[ir.Value], masked: bool) -> list[ir.Value]:  # fmt: skip
    """One position: dy's ``k_block`` channels (zero past the chunk), broadcast over the in-channel vectors;
    per tap, x's ``c_block`` channels at the flat offset ``base + tap`` (``masked``: zero in the padding, the
    address then the thread's first channel), and ``k_block x c_block`` FMAs into the tap's accumulators
    ``acc[(tap * k_block + k) * c_vectors + j]``."""
    conv, f32 = k.conv, ir.F32Type.get()
    kv, cv = k.k_vector, k.c_vector
    c_vecs = k.c_block // cv
    ws = []
    for j in range(k.k_block // kv):
        v = _load(dy, [where.pos, ix.add(th.k0, j * kv)], where.inside, kv, f32)
        for e in range(kv):
            ws.append(vector.broadcast(ir.VectorType.get([cv], f32), vector.extract(v, [], [e])))
    acc = list(acc)
    for i, tap in enumerate(taps):
        idx, cond = ix.add(where.base, tap.flat), None
        if masked:
            ok = []
            for d, low, high in _edges(k):
                at = ix.add(ix.mul(where.outs[d], conv.stride[d]), tap.offs[d])
                if low:
                    ok.append(ix.lt(-1, at))
                if high:
                    ok.append(ix.lt(at, conv.in_size[d]))
            cond = all_of(ok)
            if cond is not None:
                idx = arith.select(cond, idx, th.c0)
        for j in range(c_vecs):
            xv = _load(x, [ix.add(idx, j * cv)], cond, cv, f32)
            for kk in range(k.k_block):
                at = (i * k.k_block + kk) * c_vecs + j
                acc[at] = math.fma(xv, ws[kk], acc[at])
    return acc


def _positions_loop(ix: FoldIx, k: GemvKernel, dy: ir.Value, x: ir.Value, th: _Thread,
                    acc: list[ir.Value]) -> list[ir.Value]:  # fmt: skip
    """The lane's positions of its workgroup's chunk (lane, lane + lanes, ...: neighbours read neighbours),
    ``unroll`` of them an iteration (their loads independent of each other's FMAs: in flight together); where
    some tap may read outside x, each tap is checked, or (``interior``) an iteration whose positions are all
    interior skips the checks."""
    taps = _taps(ix, k, th)
    loop = scf.ForOp(ix.c(0), ix.c(k.loop_steps), ix.c(1), acc)
    with ir.InsertionPoint(loop.body):
        wheres = [_position(ix, k, ix.add(ix.mul(loop.induction_variable, k.unroll), u), th) for u in range(k.unroll)]

        def steps(masked: bool) -> list[ir.Value]:
            acc = list(loop.inner_iter_args)
            for where in wheres:
                acc = _step(ix, k, dy, x, th, taps, where, acc, masked)
            return acc

        inside = all_of([c for c in (_interior(ix, k, w) for w in wheres) if c is not None]) if k.interior else None
        if inside is None:  # no tap reads outside x, or the plan checks every tap (no interior branch)
            scf.YieldOp(steps(masked=bool(_edges(k))))
        else:
            branch = scf.IfOp(inside, [a.type for a in loop.inner_iter_args], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.YieldOp(steps(masked=False))
            with ir.InsertionPoint(branch.else_block):
                scf.YieldOp(steps(masked=True))
            scf.YieldOp(list(branch.results))
    return list(loop.results)


def _tree(ix: FoldIx, k: GemvKernel, smem: ir.Value, th: _Thread, count: int) -> None:
    """The lanes' sums folded into lane 0's row by a fixed binary tree (lane l adds lane l + h, h = lanes/2 ... 1;
    the same bits every run): log2(lanes) rounds a barrier apart, not lanes - 1 dependent adds a sum."""
    f32, cv = ir.F32Type.get(), k.c_vector
    vt = ir.VectorType.get([cv], f32)
    base = ix.mul(th.slot, k.accumulators)
    half = k.lanes // 2
    while half >= 1:
        branch = scf.IfOp(ix.lt(th.lane, half))
        with ir.InsertionPoint(branch.then_block):
            partner = ix.add(th.lane, half)
            for a in range(count):
                at = ix.add(base, a * cv)
                total = arith.addf(vector.load(vt, smem, [th.lane, at]), vector.load(vt, smem, [partner, at]))
                vector.store(total, smem, [th.lane, at])
            scf.YieldOp([])
        gpu.barrier()
        half //= 2


def _reduce(ix: FoldIx, k: GemvKernel, ws: ir.Value, th: _Thread, tid: ir.Value, acc: list[ir.Value]) -> None:
    """The lanes' sums through shared memory ``[lanes, slots x accumulators]`` f32, folded by :func:`_tree` (the
    same bits every run), each stored to ``ws[chunk, g, k, tap * C + c]`` (one chunk: dW ``[g, k, tap * C + c]``
    in its type; a run's taps past the filter's end are not stored). Thread ``i`` of a pass takes sum
    ``e = i + pass * threads`` in the slots' order."""
    f32 = ir.F32Type.get()
    out_t = ir.MemRefType(ws.type).element_type
    cv = k.c_vector
    c_vecs = k.c_block // cv
    per = k.accumulators
    size = k.slots * per
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    smem = memref.alloc(ir.MemRefType.get([k.lanes, size], f32, memory_space=shared), [], [])
    base = ix.mul(th.slot, per)
    for a, value in enumerate(acc):
        vector.store(value, smem, [th.lane, ix.add(base, a * cv)])
    gpu.barrier()
    _tree(ix, k, smem, th, len(acc))
    chunk = gpu.block_id(gpu.Dimension.x)
    one = ir.VectorType.get([1], f32)
    exact = size % k.threads == 0
    for j in range(-(-size // k.threads)):
        e = ix.add(tid, j * k.threads)
        e_at = e if exact else arith.minsi(e, ix.c(size - 1))
        # e = slot * per + ((tap * k_block + kk) * c_vecs + jc) * cv + v; slot = (((g * runs + run) * c_blocks
        #     + cb) * k_blocks + kb)
        a = ix.rem(e_at, per)
        slot = ix.div(e_at, per)
        v = ix.rem(a, cv)
        rest = ix.div(a, cv)
        jc = ix.rem(rest, c_vecs)
        rest = ix.div(rest, c_vecs)
        kk = ix.rem(rest, k.k_block)
        tap = ix.div(rest, k.k_block)
        kb = ix.rem(slot, k.k_blocks)
        rest = ix.div(slot, k.k_blocks)
        cb = ix.rem(rest, k.c_blocks)
        rest = ix.div(rest, k.c_blocks)
        run = ix.rem(rest, k.runs)
        g = ix.div(rest, k.runs)
        out = ix.add(ix.mul(kb, k.k_block), kk)
        t = ix.add(ix.mul(run, k.taps), tap)
        c = ix.add(ix.add(ix.mul(cb, k.c_block), ix.mul(jc, cv)), v)
        col = ix.add(ix.mul(t, k.in_channels), c)
        total = vector.load(one, smem, [ix.c(0), e_at])
        if out_t != f32:
            total = arith.truncf(ir.VectorType.get([1], out_t), total)
        at = [g, out, col] if k.direct else [chunk, g, out, col]
        conds = [] if exact else [ix.lt(e, size)]
        if k.runs * k.taps != k.filter_taps:
            conds.append(ix.lt(t, k.filter_taps))
        cond = all_of(conds)
        if cond is None:
            vector.store(total, ws, at)
            continue
        branch = scf.IfOp(cond)
        with ir.InsertionPoint(branch.then_block):
            vector.store(total, ws, at)
            scf.YieldOp([])


def grid(k: GemvKernel) -> tuple[int, int, int]:
    """Workgroups: position chunks."""
    return k.grid


def build_kernel_body(entry: ir.Block, dy: ir.Value, x: ir.Value, ws: ir.Value, k: GemvKernel) -> None:
    """Emit the kernel into ``entry`` (its operands bound), for the grid :func:`grid` gives.

    Args:
        dy: ``memref<(N * prod(out)) x (G*K) x (f16|bf16)>``.
        x: ``memref<(N * prod(in) * G*C) x (f16|bf16)>``, flat.
        ws: ``memref<chunks x G x K x (taps*C) x f32>``, the chunks' partial sums (one chunk: dW,
            ``memref<G x K x (taps*C) x dW's type>``).
    """
    ix = FoldIx(entry)
    f32 = ir.F32Type.get()
    tid = gpu.thread_id(gpu.Dimension.x)
    th = _thread(ix, k, tid)
    vt = ir.VectorType.get([k.c_vector], f32)
    zero = arith.constant(vt, ir.DenseElementsAttr.get_splat(vt, ir.FloatAttr.get_f32(0.0)))
    acc = _positions_loop(ix, k, dy, x, th, [zero] * (k.accumulators // k.c_vector))
    _reduce(ix, k, ws, th, tid, acc)
