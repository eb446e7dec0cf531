"""StreamK for the explicit sm_80 kernel: a persistent grid, each workgroup an even share of all output
tiles' k iterations, partial tiles combined through a workspace by a linear fixup with flags.

The work is ``tiles x iters`` k iterations (``tiles = G x ceil(M/bm) x ceil(N/bn)``, ``iters`` = k tiles
of the reduction), laid end to end; workgroup ``w`` of ``W`` takes ``[w*total/W, (w+1)*total/W)`` (CK's
StreamK, ``ck_tile`` ``StreamKTilePartitioner``): it walks its range tile by tile, running the pipelined
mainloop over each segment. A segment that ends before its tile's last k iteration can only be the
workgroup's last: it stores its accumulators to ``partials[w]`` (f32, in the threads' register order,
so a 16-byte coalesced store a thread and fragment), fences, and sets ``flags[w]``. The workgroup that
runs a tile's last k iteration (the *finisher*) waits on the flags of the tile's other contributors,
workgroups ``owner(tile_begin) .. w-1``, adds their partials (linear fixup) and writes dW. A workgroup
only ever waits on lower-numbered ones, which the hardware starts first: no deadlock even past one wave.

The building blocks are :mod:`convbw_mlir.kernels.gemm_sm80`'s, imported as they are (``_copy_tile``,
``_load_fragments``, ``_warp_mma``, ``_epilogue``, ``_Operand``, ``_Lanes``) and its pipeline
(``_pipeline``), which :func:`_segment_mainloop` runs over a segment's dynamic first tile and count.
Synchronization: ``memref.atomic_rmw`` (``addi``; LLVM's ``atomicrmw acq_rel``) on the flags,
``nvvm.membar`` at gpu scope (``membar.gl``) before a flag is set and after it is seen, ``gpu.barrier``
around them (CUTLASS's ``arrive_inc`` / ``wait_eq`` pattern).

The workspace is the dispatch's own: ``partials`` ``[W, frags, threads, 4]`` f32 (never read before it
is written, so left uninitialized) and ``flags`` ``[W]`` i32 (zeroed by a ``linalg.fill`` each call),
both operands tied to results of the ``flow.dispatch``.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, flow, gpu, linalg, memref, nvvm, tensor, vector

from convbw_mlir.kernels import gemm_sm80 as g80
from convbw_mlir.kernels.entry import KernelEntry, _build_executable
from convbw_mlir.kernels.ir import Ix, for_, gpu_fence, if_, while_
from convbw_mlir.policies.sm80 import MMA_M, MMA_N, GemmShape, GemmTiling

__all__ = ["StreamK", "build_dispatch", "build_kernel_body"]


@dataclass(frozen=True)
class StreamK:
    """The persistent grid of one problem: ``tiles`` output tiles of ``iters`` k iterations each,
    shared by ``workgroups`` (at most ``tiles x iters``, so that every workgroup has work)."""

    tiles: int
    iters: int
    workgroups: int

    @classmethod
    def of(cls, shape: GemmShape, t: GemmTiling, workgroups: int) -> StreamK:
        tiles = shape.groups * -(-shape.m // t.bm) * -(-shape.n // t.bn)
        iters = -(-shape.reduction // t.bk)
        return cls(tiles, iters, max(1, min(workgroups, tiles * iters)))

    @property
    def total(self) -> int:
        return self.tiles * self.iters

    def begin(self, w: int) -> int:
        return w * self.total // self.workgroups

    def owner(self, it: int) -> int:
        """The workgroup whose range holds k iteration ``it`` (the largest ``w`` with ``begin(w) <= it``)."""
        return ((it + 1) * self.workgroups - 1) // self.total

    def partial_tiles(self) -> int:
        """Tiles more than one workgroup works on (each needs a fixup)."""
        return sum(self.owner(t * self.iters) != self.owner((t + 1) * self.iters - 1) for t in range(self.tiles))


def _segment_mainloop(ix: Ix, t: GemmTiling, shape: GemmShape, a: g80._Operand, b: g80._Operand,
                      lanes: g80._Lanes, tid: ir.Value, g: ir.Value, base: ir.Value, count: ir.Value,
                      warp_m: ir.Value, warp_n: ir.Value, acc: list[ir.Value],
                      f16: ir.Type) -> list[ir.Value]:  # fmt: skip
    """gemm_sm80's software pipeline over ``count`` (>= 1, dynamic) k tiles from ``base``: the same prologue,
    steady state and commit-group accounting; tiles past the segment are zero-filled (``src-size`` 0)."""
    last = ix.sub(count, 1)

    def issue(local: int | ir.Value, stage: ir.Value) -> None:
        valid = ix.lt(local, count)
        tile = ix.add(base, arith.minsi(ix.v(local), last))  # in bounds even where nothing is read
        for op in (a, b):
            g80._copy_tile(ix, t, op, tid, g, tile, stage, valid, shape)
        nvvm.cp_async_commit_group()

    return g80._pipeline(ix, t, lanes, a, b, warp_m, warp_n, acc, f16, count, issue)


def _store_partial(ix: Ix, partials: ir.Value, flags: ir.Value, w: ir.Value, tid: ir.Value,
                   acc: list[ir.Value]) -> None:  # fmt: skip
    """A contributor's side: its accumulators to ``partials[w]``, then ``flags[w] += 1`` (release)."""
    v4 = ir.VectorType.get([4], ir.F32Type.get())
    for j, frag in enumerate(acc):
        vector.store(vector.shape_cast(v4, frag), partials, [w, ix.c(j), tid, ix.c(0)])
    gpu_fence()
    gpu.barrier()  # every thread's partial is out before thread 0 raises the flag
    with if_(arith.cmpi(arith.CmpIPredicate.eq, tid, ix.c(0))):
        one = arith.constant(ir.IntegerType.get_signless(32), 1)
        memref.atomic_rmw(arith.AtomicRMWKind.addi, one, flags, [w])


def _wait_flag(ix: Ix, flags: ir.Value, tid: ir.Value, lo: ir.Value, hi: ir.Value) -> None:
    """Thread 0 spins until ``flags[lo .. hi-1]`` are all set (an atomic read each, then ``membar.gl``:
    acquire), then a barrier: what thread 0 saw orders every thread's reads after it (CUTLASS's ``wait_eq``)."""
    i32 = ir.IntegerType.get_signless(32)
    with if_(arith.cmpi(arith.CmpIPredicate.eq, tid, ix.c(0))):
        with for_(lo, hi, ix.c(1)) as each, while_() as spin:
            seen = memref.atomic_rmw(arith.AtomicRMWKind.addi, arith.constant(i32, 0), flags, [each.iv])
            spin.again_if(arith.cmpi(arith.CmpIPredicate.eq, seen, arith.constant(i32, 0)))
        gpu_fence()
    gpu.barrier()
    gpu_fence()


def _add_partials(ix: Ix, partials: ir.Value, lo: ir.Value, hi: ir.Value, tid: ir.Value,
                  acc: list[ir.Value]) -> list[ir.Value]:  # fmt: skip
    """``acc`` plus ``partials[lo .. hi-1]`` of this thread's fragments (16-byte loads, in workgroup order)."""
    v4 = ir.VectorType.get([4], ir.F32Type.get())
    with for_(lo, hi, ix.c(1), acc) as add:
        out = []
        for j, frag in enumerate(add.args):
            p = vector.load(v4, partials, [add.iv, ix.c(j), tid, ix.c(0)])
            out.append(arith.addf(frag, vector.shape_cast(frag.type, p)))
        add.yield_(*out)
    return add.results


def _linear_fixup(ix: Ix, partials: ir.Value, flags: ir.Value, first: ir.Value, w: ir.Value, rank: ir.Value,
                  tid: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:  # fmt: skip
    """Linear: the finisher (``rank`` 0) waits for all of ``first .. w-1`` and adds their partials; the
    other contributors add nothing (their partial is their own segment)."""
    others = arith.cmpi(arith.CmpIPredicate.ult, first, w)  # a tile of one workgroup needs no fixup
    with if_(arith.andi(arith.cmpi(arith.CmpIPredicate.eq, rank, ix.c(0)), others), [v.type for v in acc]) as fin:
        _wait_flag(ix, flags, tid, first, w)
        fin.yield_(*_add_partials(ix, partials, first, w, tid, acc))
    with fin.otherwise():
        fin.yield_(*acc)
    return fin.results


def _tree_fixup(ix: Ix, partials: ir.Value, flags: ir.Value, count: ir.Value, w: ir.Value, rank: ir.Value,
                tid: ir.Value, acc: list[ir.Value], levels: int) -> list[ir.Value]:  # fmt: skip
    """Tree (a binomial tree on ``rank`` = finisher - w): at level ``s`` = 1, 2, 4 ... a contributor adds
    the partial of rank ``rank + s`` (workgroup ``w - s``) while ``s`` is below its rank's lowest set bit
    (any ``s`` for the finisher, rank 0) and ``rank + s`` is a contributor; its own partial then holds its
    subtree. ``log2(count)`` rounds instead of ``count - 1`` loads by one workgroup."""
    low = arith.andi(rank, ix.sub(ix.c(0), rank))  # rank's lowest set bit (0 for the finisher)
    root = arith.cmpi(arith.CmpIPredicate.eq, rank, ix.c(0))
    for level in range(levels):
        s = 1 << level
        below = arith.ori(root, arith.cmpi(arith.CmpIPredicate.ult, ix.c(s), low))
        take = arith.andi(below, arith.cmpi(arith.CmpIPredicate.ult, ix.add(rank, s), count))
        with if_(take, [v.type for v in acc]) as step:
            src = ix.sub(w, s)
            _wait_flag(ix, flags, tid, src, ix.add(src, 1))
            step.yield_(*_add_partials(ix, partials, src, ix.add(src, 1), tid, acc))
        with step.otherwise():
            step.yield_(*acc)
        acc = step.results
    return acc


def build_kernel_body(entry: ir.Block, a: ir.Value, b: ir.Value, partials: ir.Value, flags: ir.Value, c: ir.Value,
                      shape: GemmShape, t: GemmTiling, workgroups: int, fixup: str = "linear") -> None:  # fmt: skip
    """Emit the StreamK kernel into ``entry`` for a grid of ``StreamK.of(...).workgroups`` workgroups.

    Each workgroup walks its range's tiles from the last to the first: the segment a contributor stores
    (the one ending inside a tile, at its range's end) is its first, and the finisher's (the tile's last
    k iterations, at its range's start) its last, so partials are ready by the time they are waited for,
    and every wait is on a lower-numbered workgroup.

    Args:
        a, b: dy and x as for :func:`convbw_mlir.kernels.gemm_sm80.build_kernel_body`.
        partials: ``memref<W x frags x threads x 4 x f32>``, the contributors' accumulators.
        flags: ``memref<W x i32>``, zero at launch; ``flags[w]`` is set once ``partials[w]`` is complete.
        c: dW, ``memref<groups x m x n x (f32|f16)>``.
        fixup: ``linear`` or ``tree``.
    """
    sk = StreamK.of(shape, t, workgroups)
    ix = Ix(entry)
    f16 = ir.MemRefType(a.type).element_type  # f16 or bf16
    f32 = ir.F32Type.get()
    out = ir.MemRefType(c.type).element_type
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    tid, lane, warp, warp_m, warp_n = g80._threads(ix, t)
    w = gpu.block_id(gpu.Dimension.x)
    begin = ix.div(ix.mul(w, sk.total), sk.workgroups)
    end = ix.div(ix.mul(ix.add(w, 1), sk.total), sk.workgroups)
    a_smem = memref.alloc(ir.MemRefType.get([t.stages, t.bm, t.row], f16, memory_space=shared), [], [])
    b_smem = memref.alloc(ir.MemRefType.get([t.stages, t.bn, t.row], f16, memory_space=shared), [], [])
    lanes = g80._Lanes(
        a_row=ix.rem(lane, 16),
        a_col=ix.mul(ix.div(lane, 16), 8),
        b_row=ix.add(ix.rem(lane, 8), ix.mul(ix.div(lane, 16), 8)),
        b_col=ix.mul(ix.rem(ix.div(lane, 8), 2), 8),
    )
    v22 = ir.VectorType.get([2, 2], f32)
    zero = arith.constant(v22, ir.DenseElementsAttr.get_splat(v22, ir.FloatAttr.get_f32(0.0)))
    tiles_n = -(-shape.n // t.bn)
    tiles_mn = -(-shape.m // t.bm) * tiles_n
    last_tile = ix.div(ix.sub(end, 1), sk.iters)

    def owner(it: ir.Value) -> ir.Value:
        return ix.div(ix.sub(ix.mul(ix.add(it, 1), sk.workgroups), 1), sk.total)

    # The persistent loop: one iteration a tile this workgroup's range touches, last tile first.
    with for_(ix.c(0), ix.sub(ix.add(last_tile, 1), ix.div(begin, sk.iters)), ix.c(1)) as persistent:
        tile = ix.sub(last_tile, persistent.iv)
        tile_begin = ix.mul(tile, sk.iters)
        lo = ix.sub(arith.maxui(begin, tile_begin), tile_begin)
        hi = ix.sub(arith.minui(end, ix.add(tile_begin, sk.iters)), tile_begin)
        g = ix.div(tile, tiles_mn)
        block_m = ix.mul(ix.div(ix.rem(tile, tiles_mn), tiles_n), t.bm)
        block_n = ix.mul(ix.rem(tile, tiles_n), t.bn)
        gpu.barrier()  # the last segment's warps are done with shared memory before it is refilled
        a_op = g80._Operand(a, block_m, a_smem, t.bm, shape.m, shape.a_vector())
        b_op = g80._Operand(b, block_n, b_smem, t.bn, shape.n, shape.b_vector(), gather=shape.conv is not None)
        acc = [zero] * ((t.wm // MMA_M) * (t.wn // MMA_N))
        acc = _segment_mainloop(ix, t, shape, a_op, b_op, lanes, tid, g, lo, ix.sub(hi, lo), warp_m, warp_n, acc, f16)
        first = owner(tile_begin)  # the tile's contributors: first .. finisher (the owner of its last k iteration)
        finisher = owner(ix.add(tile_begin, sk.iters - 1))
        rank = ix.sub(finisher, w)
        if fixup == "tree":
            levels = max(1, (sk.workgroups - 1).bit_length())
            count = ix.add(ix.sub(finisher, first), 1)
            acc = _tree_fixup(ix, partials, flags, count, w, rank, tid, acc, levels)
        else:
            acc = _linear_fixup(ix, partials, flags, first, w, rank, tid, acc)
        with if_(arith.cmpi(arith.CmpIPredicate.eq, rank, ix.c(0)), else_=True) as finishes:
            g80._epilogue(ix, t, shape, c, [g], ix.add(block_m, warp_m), ix.add(block_n, warp_n), lane, acc, out)
        with finishes.otherwise():
            _store_partial(ix, partials, flags, w, tid, acc)


@dataclass(frozen=True)
class _Entry(KernelEntry):
    """The StreamK kernel's bindings: dy and x read-only; partials, flags (tied) and dW written."""

    def layout(self) -> ir.Attribute:
        entries = ["#hal.pipeline.binding<storage_buffer, ReadOnly>"] * 2
        entries += ["#hal.pipeline.binding<storage_buffer>"] * (len(self.bindings) - 2)
        return ir.Attribute.parse(f"#hal.pipeline.layout<bindings = [{', '.join(entries)}]>")


def build_dispatch(executable: str, function: str, dy: ir.Value, x: ir.Value, shape: GemmShape, t: GemmTiling,
                   streamk, out: ir.Type, subgroup_size: int,
                   module_ip: ir.InsertionPoint) -> ir.Value:  # fmt: skip
    """The StreamK executable (at ``module_ip``) and its ``flow.dispatch`` here; returns dW ``[G, M, N]``.

    ``streamk`` is the plan's :class:`convbw_mlir.plan.StreamKPlan` (workgroups, fixup).

    The workspace is created here and tied through the dispatch (operands 2, 3 -> results 1, 2), so IREE
    binds dy, x, partials, flags, then dW (operands first, then the untied result).
    """
    sk = StreamK.of(shape, t, streamk.workgroups)
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    frags = (t.wm // MMA_M) * (t.wn // MMA_N)
    ws_shape = [sk.workgroups, frags, t.threads, 4]
    c_shape = [shape.groups, shape.m, shape.n]
    in_types = [ir.RankedTensorType(v.type) for v in (dy, x)]
    entry = _Entry(
        executable=executable,
        function=function,
        grid=(sk.workgroups, 1, 1),
        workgroup_size=(t.threads, 1, 1),
        subgroup_size=subgroup_size,
        bindings=(
            *(ir.MemRefType.get(list(tt.shape), tt.element_type) for tt in in_types),
            ir.MemRefType.get(ws_shape, f32),
            ir.MemRefType.get([sk.workgroups], i32),
            ir.MemRefType.get(c_shape, out),
        ),
    )

    def body(block: ir.Block, m: list[ir.Value]) -> None:
        build_kernel_body(block, *m, shape, t, sk.workgroups, streamk.fixup)

    with module_ip:
        _build_executable(entry, body)
    partials = tensor.EmptyOp(ws_shape, f32).result
    zero = arith.constant(i32, 0)
    flags = linalg.fill(zero, outs=[tensor.EmptyOp([sk.workgroups], i32).result])
    types = [ir.RankedTensorType.get(c_shape, out), ir.RankedTensorType.get(ws_shape, f32),
             ir.RankedTensorType.get([sk.workgroups], i32)]  # fmt: skip
    index = ir.IndexType.get()  # IREE's tied-operand indices are index attributes
    tied = ir.ArrayAttr.get([ir.IntegerAttr.get(index, v) for v in (-1, 2, 3)])
    target = ir.SymbolRefAttr.get([executable, function])
    op = flow.DispatchOp(types, [], ir.ArrayAttr.get([target]), [dy, x, partials, flags], [], [], tied_operands=tied)
    return op.results[0]
