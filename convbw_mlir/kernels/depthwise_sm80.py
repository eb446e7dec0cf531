"""The depthwise sm_80 kernel of the explicit strategy, written with the MLIR Python builders.

``ws[chunk, g, 0, t] = sum over the chunk's rows of dy[n, o, g] * x[n, o * s + t * d - p, g]`` for a
channels-last depthwise problem (layout 2, one channel a group; the numbers and their rule are
``convbw_mlir.policies.depthwise``): dy binds as ``[N, *out, G]``, x as ``[N, *in, G]`` (any rank: 1-D, 2-D,
3-D), the f32 workspace ``ws`` as ``[chunks, G, 1, taps]``, which a second stage (``linalg.generic``) sums
and rounds to dW's type. Thin groups (C, K <= 16 a group): dy ``[N, *out, G*K]``, x ``[N, *in, G*C]``,
``ws[chunk, g, k, t * C + c]``; a thread's vector runs over the group's in channels and dy's value of its
out channel is broadcast over it.

Layers, each a function with one job: :func:`_thread` (which channel vector, taps and row lane a thread
owns), :func:`_row` (a row's image and outer coordinates, and where x's outer coordinates fall),
:func:`_step` (one step of ``unroll`` outputs along the innermost dimension: the dy vectors, the x window,
the FMAs that reuse each x vector for every tap that reads it), :func:`_rows_loop` (the thread's rows and
steps, the accumulators carried), :func:`_reduce` (the row lanes' sums, in order, through shared memory,
to the workspace).
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, math, memref, scf, vector

from convbw_mlir.kernels.ir import FoldIx, all_of, unravel
from convbw_mlir.policies.depthwise import DepthwiseKernel

__all__ = ["SUM_THREADS", "build_kernel_body", "build_sum_body", "grid", "sum_grid"]

# The stage 2 (:func:`build_sum_body`): 32 outputs a workgroup (one 128-byte line of f32 a chunk) times 16 chunk
# lanes, each lane's loads 8 at once: IREE's own reduction gave one warp a 32 outputs and a serial chain of every
# chunk's load, latency-bound (its time grew with the chunks: 448 chunks of ConvNeXt-T's 7x7, issue 40).
SUM_OUTPUTS, SUM_LANES, SUM_UNROLL = 32, 16, 8
SUM_THREADS = SUM_OUTPUTS * SUM_LANES


@dataclass
class _Thread:
    """What one thread owns: its first channel of x ``g`` and its channel of dy ``dg`` (depthwise: the same,
    a vector of groups; grouped: a vector of group g's in channels and one out channel, broadcast), its run of
    inner taps (``run``), its outer tap's coordinates ``outer``, its row lane ``lane``, and its slot among a
    row lane's threads ``slot``."""

    g: ir.Value
    dg: ir.Value
    run: ir.Value
    outer: list[ir.Value]
    lane: ir.Value
    slot: ir.Value


def _thread(ix: FoldIx, k: DepthwiseKernel, tid: ir.Value) -> _Thread:
    """Threads, fastest first: channel vector, inner tap run, outer tap, row lane (the policy's order)."""
    per_lane = k.lanes_c * k.runs * k.outer_taps
    cv = ix.rem(tid, k.lanes_c)
    rest = ix.div(tid, k.lanes_c)
    run = ix.rem(rest, k.runs)
    rest = ix.div(rest, k.runs)
    outer = ix.rem(rest, k.outer_taps)
    if k.paired:
        g = ix.add(ix.mul(gpu.block_id(gpu.Dimension.x), k.channels), ix.mul(cv, k.vector))
        dg = g
    else:  # cv = (group * K + out channel) * (C / vector) + in-channel vector
        vecs = k.in_channels // k.vector
        rest = ix.div(cv, vecs)
        group = ix.add(ix.mul(gpu.block_id(gpu.Dimension.x), k.group_tile), ix.div(rest, k.out_channels))
        g = ix.add(ix.mul(group, k.in_channels), ix.mul(ix.rem(cv, vecs), k.vector))
        dg = ix.add(ix.mul(group, k.out_channels), ix.rem(rest, k.out_channels))
    return _Thread(g, dg, run, unravel(ix, outer, k.conv.filter[:-1]), ix.div(tid, per_lane),
                   ix.rem(tid, per_lane))  # fmt: skip


def _row(ix: FoldIx, k: DepthwiseKernel, row: ir.Value, th: _Thread) -> tuple[ir.Value, list[ir.Value], ir.Value,
                                                                          list[ir.Value], list[ir.Value]]:  # fmt: skip
    """Row ``row`` -> (its image, dy's outer coordinates, its segment, x's outer coordinates (clamped), the
    conditions that x's outer coordinates are inside the image)."""
    conv = k.conv
    seg = ix.rem(row, k.segments)
    rest = ix.div(row, k.segments)
    outer_out = conv.out_size[:-1]
    plane = 1
    for s in outer_out:
        plane *= s
    image = ix.div(rest, plane)
    outs = unravel(ix, ix.rem(rest, plane), outer_out)
    coords, ok = [], []
    for dim, (o, f) in enumerate(zip(outs, th.outer)):
        at = arith.subi(ix.add(ix.mul(o, conv.stride[dim]), ix.mul(f, conv.dilation[dim])), ix.c(conv.pad[dim]))
        last = (conv.out_size[dim] - 1) * conv.stride[dim] + (conv.filter[dim] - 1) * conv.dilation[dim]
        if conv.pad[dim]:
            ok.append(ix.lt(-1, at))
        if last - conv.pad[dim] >= conv.in_size[dim]:
            ok.append(ix.lt(at, conv.in_size[dim]))
        coords.append(ix.clamp(at, conv.in_size[dim] - 1))
    return image, outs, seg, coords, ok


def _load(ix: FoldIx, mem: ir.Value, idx: list[ir.Value], ok: ir.Value | None, v: int) -> ir.Value:
    """``v`` channels at ``idx`` in their 16-bit type, zero where ``ok`` is false (the address is clamped inside;
    the select acts on the 16-bit vector: half the selects of the f32 one)."""
    elem = ir.MemRefType(mem.type).element_type
    val = vector.load(ir.VectorType.get([v], elem), mem, idx)
    if ok is not None:
        zero = arith.constant(val.type, ir.DenseElementsAttr.get_splat(val.type, ir.FloatAttr.get(elem, 0.0)))
        val = arith.select(ok, val, zero)
    return val


def _identities(ix: FoldIx, tid: ir.Value, elem: ir.Type) -> tuple[ir.Value, ir.Value]:
    """This lane's B fragments of the two 16x8 halves of the 16x16 identity (``mma.sync`` m16n8k16, B column-major:
    lane ``4 g + t`` holds ``B[2t, g], B[2t+1, g]`` and ``B[2t+8, g], B[2t+9, g]``): ``A x I_lo`` is A's first 8
    columns, ``A x I_hi`` its last 8, in the f32 accumulator's layout (``elem``: f16 or bf16)."""
    f16 = elem
    lane = ix.rem(tid, 32)
    g, t2 = ix.div(lane, 4), ix.mul(ix.rem(lane, 4), 2)
    one, zero = arith.constant(f16, 1.0), arith.constant(f16, 0.0)
    eq = [arith.select(arith.cmpi(arith.CmpIPredicate.eq, ix.add(t2, i), g), one, zero) for i in (0, 1)]
    frag = ir.VectorType.get([2, 2], f16)
    flat = ir.VectorType.get([4], f16)
    lo = vector.shape_cast(frag, vector.from_elements(flat, [eq[0], eq[1], zero, zero]))
    hi = vector.shape_cast(frag, vector.from_elements(flat, [zero, zero, eq[0], eq[1]]))
    return lo, hi


def _convert(k: DepthwiseKernel, raw: list[ir.Value], ident: tuple[ir.Value, ir.Value] | None) -> list[ir.Value]:
    """The 16-bit vectors ``raw`` as f32: ``arith.extf``, or (``ident``: 4 channels a vector, whole warps)
    through the tensor cores, two vectors an ``mma.sync`` pair: the 8 halves of a lane are its A fragment
    ``a0..a7``, and ``A x I_lo`` / ``A x I_hi`` hand each lane back its own first / last 4 as f32, exactly
    (a product by 1 and sums of zeros; ``cvt.f32.f16``, 16 a clock an SM, bounded the f16 kernel; bf16's
    shifts take integer slots)."""
    f32 = ir.F32Type.get()
    if ident is None:
        return [arith.extf(ir.VectorType.get([ir.VectorType(r.type).shape[0]], f32), r) for r in raw]
    from convbw_mlir.kernels.nvgpu import mma_sync

    f16 = ir.VectorType(raw[0].type).element_type  # f16 or bf16: the mma of that type
    acc_t, vec4 = ir.VectorType.get([2, 2], f32), ir.VectorType.get([4], f32)
    zero = arith.constant(acc_t, ir.DenseElementsAttr.get_splat(acc_t, ir.FloatAttr.get_f32(0.0)))
    out = []
    for i in range(0, len(raw), 2):
        pair = raw[i : i + 2] if i + 1 < len(raw) else [raw[i], raw[i]]
        halves = [vector.extract(v, [], [j]) for v in pair for j in range(4)]
        a = vector.shape_cast(ir.VectorType.get([4, 2], f16), vector.from_elements(ir.VectorType.get([8], f16), halves))
        for b in ident[: min(2, len(raw) - i)]:
            out.append(vector.shape_cast(vec4, mma_sync(a, b, zero)))
    return out


def _first_x(ix: FoldIx, k: DepthwiseKernel, th: _Thread, wo0: ir.Value) -> ir.Value:
    """The first x position a step reads along the innermost dimension: ``wo0 * s - p + run * taps * d``."""
    conv = k.conv
    s, d, p = conv.stride[-1], conv.dilation[-1], conv.pad[-1]
    return arith.subi(ix.add(ix.mul(wo0, s), ix.mul(th.run, k.taps * d)), ix.c(p))


def _interior(ix: FoldIx, k: DepthwiseKernel, row_ok: list[ir.Value], x_ok: list[ir.Value], base: ir.Value,
              wo0: ir.Value) -> ir.Value | None:  # fmt: skip
    """Whether a step reads nothing outside x and dy (so it needs no mask), or None where every step is so."""
    conv = k.conv
    conds = list(row_ok) + list(x_ok)
    if k.segments * k.segment > conv.out_size[-1]:
        conds.append(ix.lt(ix.add(wo0, k.unroll - 1), conv.out_size[-1]))
    if conv.pad[-1]:
        conds.append(ix.lt(-1, base))
    if k.reach >= conv.in_size[-1]:
        conds.append(ix.lt(ix.add(base, k.offsets[-1]), conv.in_size[-1]))
    return all_of(conds)


def _step_loads(ix: FoldIx, k: DepthwiseKernel, dy: ir.Value, x: ir.Value, th: _Thread, row_ok: list[ir.Value],
                image: ir.Value, outs: list[ir.Value], x_outer: list[ir.Value], x_ok: list[ir.Value], wo0: ir.Value,
                masked: bool = True) -> list[ir.Value]:  # fmt: skip
    """One step's reads, in their 16-bit type: outputs ``wo0 .. wo0 + unroll - 1`` of the innermost dimension's dy
    vectors (zero past the row's end), then the x window (each position the step's taps read once, zero in the
    padding), in :attr:`DepthwiseKernel.offsets`' order. ``masked`` False: a step :func:`_interior` found inside
    x and dy (no clamp, no select)."""
    conv = k.conv
    wo_size, w_size = conv.out_size[-1], conv.in_size[-1]
    p = conv.pad[-1]
    dys = []
    for u in range(k.unroll):
        wo = ix.add(wo0, u)
        ok = list(row_ok) if masked else []
        if masked and k.segments * k.segment > wo_size:
            ok.append(ix.lt(wo, wo_size))
            wo = arith.minsi(wo, ix.c(wo_size - 1))
        # grouped: one out channel's value, broadcast over the in-channel vector after the conversion
        dys.append(_load(ix, dy, [image, *outs, wo, th.dg], all_of(ok), k.vector if k.paired else 1))
    base = _first_x(ix, k, th, wo0)
    xs = []
    for off in k.offsets:
        at = ix.add(base, off)
        if not masked:
            xs.append(_load(ix, x, [image, *x_outer, at, th.g], None, k.vector))
            continue
        ok = list(x_ok)
        if p:
            ok.append(ix.lt(-1, at))
        if k.reach >= w_size:
            ok.append(ix.lt(at, w_size))
        xs.append(_load(ix, x, [image, *x_outer, ix.clamp(at, w_size - 1), th.g], all_of(ok), k.vector))
    return dys + xs


def _step_fmas(k: DepthwiseKernel, vals: list[ir.Value], acc: list[ir.Value]) -> list[ir.Value]:
    """``unroll x taps`` FMAs into the run's accumulators from one step's f32 values (:func:`_step_loads`' order),
    each x vector reused by every tap that reads it."""
    s, d = k.conv.stride[-1], k.conv.dilation[-1]
    dys, xs = vals[: k.unroll], dict(zip(k.offsets, vals[k.unroll :]))
    if not k.paired and k.vector > 1:
        dys = [vector.broadcast(ir.VectorType.get([k.vector], ir.F32Type.get()), vector.extract(v, [], [0]))
               for v in dys]  # fmt: skip
    acc = list(acc)
    for t in range(k.taps):
        for u in range(k.unroll):
            acc[t] = math.fma(xs[u * s + t * d], dys[u], acc[t])
    return acc


def _raw_types(k: DepthwiseKernel, dy: ir.Value, x: ir.Value) -> list[ir.Type]:
    """The types of :func:`_step_loads`' values: dy's vectors (one value a group's out channel where it is
    broadcast), then x's."""

    def vec(mem: ir.Value, n: int) -> ir.Type:
        return ir.VectorType.get([n], ir.MemRefType(mem.type).element_type)

    return [vec(dy, k.vector if k.paired else 1)] * k.unroll + [vec(x, k.vector)] * len(k.offsets)


def _rows_loop(ix: FoldIx, k: DepthwiseKernel, dy: ir.Value, x: ir.Value, th: _Thread, acc: list[ir.Value],
               ident: tuple[ir.Value, ir.Value] | None = None) -> list[ir.Value]:  # fmt: skip
    """The thread's rows of its workgroup's chunk (lane, lane + lanes_r, ...), each in steps of ``unroll``."""
    chunk = gpu.block_id(gpu.Dimension.y)
    first = ix.mul(chunk, k.chunk_rows)
    rows = scf.ForOp(ix.c(0), ix.c(-(-k.chunk_rows // k.lanes_r)), ix.c(1), acc)
    with ir.InsertionPoint(rows.body):
        local = ix.add(ix.mul(rows.induction_variable, k.lanes_r), th.lane)
        row = ix.add(first, local)
        row_ok = []
        if k.launched > k.threads:  # the threads that round the workgroup up to whole warps own no rows
            row_ok.append(ix.lt(th.lane, k.lanes_r))
        if k.chunk_rows % k.lanes_r:
            row_ok.append(ix.lt(local, k.chunk_rows))
        if k.chunk_rows * k.chunks != k.rows:
            row_ok.append(ix.lt(row, k.rows))
        if row_ok:
            row = arith.minsi(row, ix.c(k.rows - 1))
        image, outs, seg, x_outer, x_ok = _row(ix, k, row, th)
        n_steps = k.segment // k.unroll

        def reads(step: ir.Value) -> list[ir.Value]:
            """Step ``step``'s raw vectors: an interior step (most) without clamps or selects, an edge step with."""
            wo0 = ix.add(ix.mul(seg, k.segment), ix.mul(step, k.unroll))
            inside = _interior(ix, k, row_ok, x_ok, _first_x(ix, k, th, wo0), wo0)
            if inside is None:  # no step of this problem reads outside x or dy
                return _step_loads(ix, k, dy, x, th, row_ok, image, outs, x_outer, x_ok, wo0, masked=False)
            branch = scf.IfOp(inside, _raw_types(k, dy, x), has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.YieldOp(_step_loads(ix, k, dy, x, th, row_ok, image, outs, x_outer, x_ok, wo0, masked=False))
            with ir.InsertionPoint(branch.else_block):
                scf.YieldOp(_step_loads(ix, k, dy, x, th, row_ok, image, outs, x_outer, x_ok + row_ok, wo0))
            return list(branch.results)

        carried = list(rows.inner_iter_args)
        if k.prefetch:  # the row's first step read before the loop; each step then reads the next one first
            carried += reads(ix.c(0))
        steps = scf.ForOp(ix.c(0), ix.c(n_steps), ix.c(1), carried)
        with ir.InsertionPoint(steps.body):
            acc = list(steps.inner_iter_args)[: k.taps]
            if k.prefetch:  # the next step's loads in flight while this one's are converted and multiplied
                raw = list(steps.inner_iter_args)[k.taps :]
                ahead = reads(arith.minsi(ix.add(steps.induction_variable, 1), ix.c(n_steps - 1)))
            else:
                raw, ahead = reads(steps.induction_variable), []
            # converted and multiplied after the join: every lane of a warp reaches the mma.sync conversion
            scf.YieldOp(_step_fmas(k, _convert(k, raw, ident), acc) + ahead)
        scf.YieldOp(list(steps.results)[: k.taps])
    return list(rows.results)


def _reduce(ix: FoldIx, k: DepthwiseKernel, ws: ir.Value, th: _Thread, tid: ir.Value, acc: list[ir.Value]) -> None:
    """The row lanes' sums through shared memory ``[lanes_r, slots x taps x vector]`` f32, added in lane
    order (the same bits every run), each sum stored to ``ws[chunk, g, k, tap * C + c]`` (the run's taps past
    the filter's end are not stored). Thread ``i`` of a pass takes sum ``e = i + pass * threads`` in ws's own
    order (group, out channel, tap, in channel; the run's padded taps included): consecutive threads write
    consecutive words."""
    f32 = ir.F32Type.get()
    per_lane = k.lanes_c * k.runs * k.outer_taps
    size = per_lane * k.taps * k.vector
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    lanes = -(-k.launched // per_lane)  # the whole-warp threads' (zero) sums too: rows past lanes_r, never read
    smem = memref.alloc(ir.MemRefType.get([lanes, size], f32, memory_space=shared), [], [])
    for t in range(k.taps):
        vector.store(acc[t], smem, [th.lane, ix.mul(ix.add(ix.mul(th.slot, k.taps), t), k.vector)])
    gpu.barrier()
    chunk = gpu.block_id(gpu.Dimension.y)
    one = ir.VectorType.get([1], f32)
    exact = size % k.launched == 0
    for j in range(-(-size // k.launched)):
        e = ix.add(tid, j * k.launched)
        e_at = e if exact else arith.minsi(e, ix.c(size - 1))
        # e = (((((group * K + out) * outer_taps + outer) * runs + run) * taps + t) * C + c
        c = ix.rem(e_at, k.in_channels)
        rest = ix.div(e_at, k.in_channels)
        t = ix.rem(rest, k.taps)
        rest = ix.div(rest, k.taps)
        run = ix.rem(rest, k.runs)
        rest = ix.div(rest, k.runs)
        outer = ix.rem(rest, k.outer_taps)
        rest = ix.div(rest, k.outer_taps)
        out = ix.rem(rest, k.out_channels)
        group = ix.div(rest, k.out_channels)
        if k.paired:  # a vector holds consecutive groups
            cv, v = ix.div(group, k.vector), ix.rem(group, k.vector)
        else:  # a vector holds consecutive in channels of one group and out channel
            vecs = k.in_channels // k.vector
            cv = ix.add(ix.mul(ix.add(ix.mul(group, k.out_channels), out), vecs), ix.div(c, k.vector))
            v = ix.rem(c, k.vector)
        slot = ix.add(ix.mul(ix.add(ix.mul(outer, k.runs), run), k.lanes_c), cv)  # the thread's (_thread's order)
        at = ix.add(ix.mul(ix.add(ix.mul(slot, k.taps), t), k.vector), v)
        inner = ix.add(ix.mul(run, k.taps), t)
        g = ix.add(ix.mul(gpu.block_id(gpu.Dimension.x), k.group_tile), group)
        col = ix.add(ix.mul(ix.add(ix.mul(outer, k.inner), inner), k.in_channels), c)  # tap * C + c
        total = vector.load(one, smem, [ix.c(0), at])
        for lane in range(1, k.lanes_r):
            total = arith.addf(total, vector.load(one, smem, [ix.c(lane), at]))
        conds = [] if exact else [ix.lt(e, size)]
        if k.runs * k.taps != k.inner:
            conds.append(ix.lt(inner, k.inner))
        cond = all_of(conds)
        if cond is None:
            vector.store(total, ws, [chunk, g, out, col])
            continue
        branch = scf.IfOp(cond)
        with ir.InsertionPoint(branch.then_block):
            vector.store(total, ws, [chunk, g, out, col])
            scf.YieldOp([])


def sum_grid(outputs: int) -> tuple[int, int, int]:
    """The stage 2's workgroups: :data:`SUM_OUTPUTS` outputs each."""
    return -(-outputs // SUM_OUTPUTS), 1, 1


def build_sum_body(entry: ir.Block, ws: ir.Value, out: ir.Value, chunks: int, outputs: int) -> None:
    """The stage 2: ``out[o] = sum over j of ws[j, o]``, rounded to out's type. Lane ``l`` of a workgroup adds
    chunks ``l, l + SUM_LANES, ...`` in order; the lanes' sums meet in shared memory and are added in lane order
    (the same bits every run).

    Args:
        ws: ``memref<chunks x outputs x f32>``, the depthwise kernel's partial sums.
        out: ``memref<outputs x (f16|bf16|f32)>``.
    """
    ix = FoldIx(entry)
    f32 = ir.F32Type.get()
    tid = gpu.thread_id(gpu.Dimension.x)
    col, lane = ix.rem(tid, SUM_OUTPUTS), ix.div(tid, SUM_OUTPUTS)
    o = ix.add(ix.mul(gpu.block_id(gpu.Dimension.x), SUM_OUTPUTS), col)
    ragged = outputs % SUM_OUTPUTS != 0
    o_at = arith.minsi(o, ix.c(outputs - 1)) if ragged else o
    zero = arith.constant(f32, 0.0)
    per_step = SUM_LANES * SUM_UNROLL
    steps = scf.ForOp(ix.c(0), ix.c(-(-chunks // per_step)), ix.c(1), [zero])
    with ir.InsertionPoint(steps.body):
        acc = steps.inner_iter_args[0]
        first = ix.add(ix.mul(steps.induction_variable, per_step), lane)
        for u in range(SUM_UNROLL):
            j = ix.add(first, u * SUM_LANES)
            if chunks % per_step:  # the last step's chunks past the end: read the last one, add nothing
                val = memref.load(ws, [arith.minsi(j, ix.c(chunks - 1)), o_at])
                val = arith.select(ix.lt(j, chunks), val, zero)
            else:
                val = memref.load(ws, [j, o_at])
            acc = arith.addf(acc, val)
        scf.YieldOp([acc])
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    smem = memref.alloc(ir.MemRefType.get([SUM_LANES, SUM_OUTPUTS], f32, memory_space=shared), [], [])
    vector.store(vector.broadcast(ir.VectorType.get([1], f32), steps.results[0]), smem, [lane, col])
    gpu.barrier()
    first_lane = ix.lt(tid, SUM_OUTPUTS)
    branch = scf.IfOp(first_lane if not ragged else arith.andi(first_lane, ix.lt(o, outputs)))
    with ir.InsertionPoint(branch.then_block):
        total = memref.load(smem, [ix.c(0), col])
        for other in range(1, SUM_LANES):
            total = arith.addf(total, memref.load(smem, [ix.c(other), col]))
        elem = ir.MemRefType(out.type).element_type
        total = vector.broadcast(ir.VectorType.get([1], f32), total)
        if elem != f32:
            total = arith.truncf(ir.VectorType.get([1], elem), total)
        vector.store(total, out, [o])
        scf.YieldOp([])


def grid(k: DepthwiseKernel) -> tuple[int, int, int]:
    """Workgroups: channel tiles, row chunks."""
    return k.grid


def build_kernel_body(entry: ir.Block, dy: ir.Value, x: ir.Value, ws: ir.Value, k: DepthwiseKernel) -> None:
    """Emit the kernel into ``entry`` (its operands bound), for the grid :func:`grid` gives.

    Args:
        dy: ``memref<N x *out x (G*K) x (f16|bf16)>``.
        x: ``memref<N x *in x (G*C) x (f16|bf16)>``.
        ws: ``memref<chunks x G x K x (taps*C) x f32>``, the chunks' partial sums.
    """
    ix = FoldIx(entry)
    f32 = ir.F32Type.get()
    tid = gpu.thread_id(gpu.Dimension.x)
    th = _thread(ix, k, tid)
    vt = ir.VectorType.get([k.vector], f32)
    zero = arith.constant(vt, ir.DenseElementsAttr.get_splat(vt, ir.FloatAttr.get_f32(0.0)))
    ident = _identities(ix, tid, ir.MemRefType(x.type).element_type) if k.mma_convert else None
    acc = _rows_loop(ix, k, dy, x, th, [zero] * k.taps, ident)
    _reduce(ix, k, ws, th, tid, acc)
