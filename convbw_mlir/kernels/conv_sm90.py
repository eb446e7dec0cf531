"""The sm_90a weight gradient of a channels-last 1-, 2- or 3-D convolution: the Hopper GEMM's pipeline on an
implicit GEMM.

Layout 2 (x NHWGC, dy NHWGK, dW GKYXC; 1-D NWGC, 3-D NDHWGC) is per group, as for the sm_80 kernel, ``dW[k, j] =
sum_r dy[r, k] * x[n, ho s + y d - p, wo s + x d - p, c]`` with ``j = (y X + x) C + c`` and ``r = (n, ho, wo)``
(the 2-D case; 3-D adds the depth ``z`` before ``y`` and ``do`` before ``ho``, 1-D keeps ``x`` and ``wo`` only).
Both operands are reduction-outer, so both reach ``wgmma`` **MN-major** (the transpose bits of 16-bit wgmma): a k
tile of 64 reduction rows is, in shared memory, 64 rows of 128 bytes (64 channels) per operand box, swizzled
in 1024-byte atoms of 8 rows, exactly what a TMA box with the 128-byte swizzle writes.

- **dy** is the plain 2-D ``[N Ho Wo, K]`` matrix: a tiled TMA map, box ``64 r x 64 k``, one box a consumer.
- **x** goes by TMA's **im2col** mode (``cp.async.bulk.tensor.4d.im2col``; 1-D: ``.3d`` over ``[N, W, C]``,
  3-D: ``.5d`` over ``[N, D, H, W, C]``, one 16-bit im2col offset a spatial dim): the map covers ``[N, H, W, C]``
  with the bounding box ``[-p, H - 1 + p - (Y - 1) d]`` per image (``Ho`` positions at the traversal
  stride ``s``: cuTensorMapEncodeIm2col's corners and elementStrides), and one load walks 64 consecutive
  output positions ``r0 .. r0 + 63`` across rows and images (W, then H, then N), adding the tap's offset
  ``(x d, y d)`` (the instruction's 16-bit im2col offsets) and reading zero outside the image: the
  padding for free, and the k tile is a plain 64-row slice of the flattened reduction, as dy's is, so
  a ragged ``Wo`` costs nothing (a tiled 4-D box of ``rows x Wo-positions`` would waste what it pads).
  A 256-column tile is four such boxes of 64 channels each, each of its own tap (``C % 64 == 0``). With
  ``C % 64 != 0`` (``C % 8 == 0``: 16-byte box starts) each tap's channels are padded to whole boxes
  (:attr:`ConvSm90.cp`; the GEMM's N is ``taps x Cp``): a box past a group's C reads zeros (past the tensor) or
  the next group's channels, which only feed GEMM columns the epilogue never stores (a column is its own sum).
- The reduction past ``N Ho Wo`` reads zeros from both maps (out of bounds); split-K cuts the k tiles
  into ``splits`` slices (grid z), each writing f32 partial sums ``[splits, G, K, Y X C]`` that a second
  pass adds up.
- StreamK (``streamk`` workgroups, a persistent grid): the ``tiles x k tiles`` iterations laid end to end,
  workgroup ``w`` takes ``[w T / W, (w + 1) T / W)`` and walks its tiles last first. A segment that ends
  before its tile's last k tile (only a range's last, walked first) stores its accumulators to
  ``partials[w, consumer]`` (f32, 16-byte chunks in thread order: coalesced) and raises ``flags[w,
  consumer]``; the tile's *finisher* (the segment with its last k tile) waits on the flags of the tile's
  other contributors (lower-numbered workgroups only), adds their partials, resets the flags to zero
  (so a launch leaves them as it found them) and stores dW. Fix-ups only at the seams between ranges.
- Groups (NHWGC / NHWGK): group ``g``'s dy columns start at ``g K`` and its x channels at ``g C`` of the
  same two maps; grid z runs over groups x splits. Rows past K of a row tile read the next group's dy and
  are never stored.

The rest is gemm_sm90's: a producer warpgroup, ``consumers`` wgmma warpgroups, an mbarrier ring,
``setmaxnreg``. docs/explicit-kernels.md "Hopper: the weight gradient" has the design and the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, llvm, memref, nvvm, vector

from convbw_mlir.cuda_launch import im2col_corners
from convbw_mlir.kernels.entry import KernelEntry
from convbw_mlir.kernels.gemm_sm90 import (
    SWIZZLE_BYTES,
    WARPGROUP,
    WGMMA_K,
    WGMMA_M,
    Sm90Tiling,
    acc_type,
    global_ptr,
    shared_base,
    zero_acc,
)
from convbw_mlir.kernels.ir import Ints, Pipeline, for_, gpu_fence, if_, while_

__all__ = ["BOX", "ConvSm90", "build_streamk_dispatch", "conv_entry", "conv_module", "descriptor_mn", "from_problem"]

BOX = 64  # channels of one TMA box: a 128-byte swizzled row of 16-bit elements
ATOM_ROWS = 8  # reduction rows of one 1024-byte swizzle atom


@dataclass(frozen=True)
class ConvSm90:
    """One kernel's numbers, derived once: the problem's geometry, the tiling and the split.

    Attributes:
        n, h, w, c: x's sizes (NHWC); k: output channels; fy, fx: filter; ho, wo: dy's spatial sizes.
        stride, dilation, pad: one value a spatial dim, outermost first: ``(h, w)`` for 2-D, ``(w,)`` for 1-D
            (``h = fy = ho = 1``), ``(d, h, w)`` for 3-D (pad: the low side; the high side follows from the
            output's sizes); their length is the convolution's rank.
        tiling: the GEMM tiling (``bn`` a multiple of 64: that many im2col boxes a stage).
        splits: split-K slices of the k tiles (grid z); > 1 writes f32 partials ``[splits, G, K, Y X C]``.
        groups: G; c and k are a group's channels.
        d, fz, do: 3-D's depth of x, of the filter and of dy (1 below 3-D).
        streamk: workgroups of the StreamK grid (0: none; then splits 1 and tiling not persistent).
        fused: the split's second stage in the kernel (splits > 1): each thread, after storing its partial,
            counts itself in on its own counter; the thread that arrives last for its fragment adds the
            splits' partials and writes dW (no second pass).
        merge: 0: the plain form (C a multiple of 64). ``m >= 1``: the boxed form (thin and medium groups): ``m``
            consecutive groups share one 64-channel im2col box a tap (``m C <= 64``) and ``m K`` GEMM rows, the
            GEMM's columns ``taps x 64``; only the block diagonal (a group's rows with its own channels) is
            stored, the rest (other groups' channels, the box's channels past ``m C``) computed and dropped.
    """

    n: int
    h: int
    w: int
    c: int
    k: int
    fy: int
    fx: int
    ho: int
    wo: int
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    tiling: Sm90Tiling = Sm90Tiling()
    splits: int = 1
    groups: int = 1
    d: int = 1
    fz: int = 1
    do: int = 1
    streamk: int = 0
    fused: bool = False
    merge: int = 0

    def __post_init__(self) -> None:
        for name in ("stride", "dilation", "pad"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        rank = len(self.stride)
        if rank not in (1, 2, 3) or len(self.dilation) != rank or len(self.pad) != rank:
            raise ValueError(f"stride: {self.stride}, dilation: {self.dilation}, pad: {self.pad} (one value a "
                             "spatial dim, 1 to 3 of them)")  # fmt: skip
        flat = {"d": self.d, "fz": self.fz, "do": self.do} if rank < 3 else {}
        flat.update({"h": self.h, "fy": self.fy, "ho": self.ho} if rank == 1 else {})
        for name, v in flat.items():
            if v != 1:
                raise ValueError(f"{name}: {v} (1 in a {rank}-D convolution)")
        if self.merge:
            self._boxed_checks()
        elif self.c % 8:  # x's box starts: 16 bytes (C % 64 != 0: each tap's channels padded to whole boxes)
            raise ValueError(f"in_channels: {self.c} (the sm_90a kernel takes C a multiple of 8)")
        elif self.padded and (self.streamk or self.fused or self.tiling.persistent):
            raise ValueError(f"in_channels: {self.c} (padded to {self.cp}: the plain split-K grid only, no "
                             "streamk, fused or persistent)")  # fmt: skip
        elif self.k % 8:  # dy's rows: a multiple of 16 bytes (TMA's global strides)
            raise ValueError(f"out_channels: {self.k} (the sm_90a kernel takes K a multiple of 8)")
        if self.tiling.bn % BOX:
            raise ValueError(f"bn: {self.tiling.bn} (a multiple of {BOX}: whole im2col boxes)")
        if not 1 <= self.splits <= self.ktiles:
            raise ValueError(f"splits: {self.splits} (1 .. {self.ktiles} k tiles)")
        if self.splits > 1 and (self.splits - 1) * self.chunk >= self.ktiles:
            raise ValueError(f"splits: {self.splits} leave the last one empty ({self.ktiles} k tiles)")
        if self.streamk and (self.splits > 1 or self.tiling.persistent):
            raise ValueError(f"streamk: {self.streamk} (with splits 1 and no persistent tiling, its own grid)")
        if self.fused and self.splits == 1:
            raise ValueError("fused: True (the split's second stage in the kernel needs splits > 1)")
        if not 0 <= self.streamk <= self.sk_total:
            raise ValueError(f"streamk: {self.streamk} (0 .. {self.sk_total} iterations, one at least a workgroup)")

    def _boxed_checks(self) -> None:
        """The boxed form's limits (``merge`` >= 1): the merged groups' channels in one box, pairs stored whole,
        TMA's 16-byte global strides and box starts, the plain split-K grid."""
        if self.merge < 1 or self.merge * self.c > BOX:
            raise ValueError(f"merge: {self.merge} groups of {self.c} channels (1 .. {BOX // max(self.c, 1)}: "
                             f"their channels in one {BOX}-channel box)")  # fmt: skip
        if self.c % 2:
            raise ValueError(f"in_channels: {self.c} (the boxed form stores pairs of channels: C even)")
        if (self.groups * self.c) % 8 or (self.groups * self.k) % 8:
            raise ValueError(f"groups: {self.groups} x {self.c} in, {self.k} out channels (G C and G K multiples of "
                             "8: TMA's 16-byte rows)")  # fmt: skip
        # box b's TMA starts at x channel b m C, dy column b m K: sm_90a stops on an innermost coordinate off 16 bytes
        if self.groups > self.merge and ((self.merge * self.c) % 8 or (self.merge * self.k) % 8):
            mc, mk = self.merge * self.c, self.merge * self.k
            raise ValueError(f"merge: {self.merge} x {self.c} in, {self.k} out channels = {mc}, {mk} (each a "
                             "multiple of 8: 16 bytes, every box's TMA start)")  # fmt: skip
        if self.streamk or self.fused or self.tiling.persistent:
            raise ValueError("merge: the boxed form runs the plain split-K grid (no streamk, fused or persistent)")

    @property
    def boxed(self) -> bool:
        """The boxed form (thin and medium groups: :attr:`merge` groups a 64-channel box)."""
        return self.merge > 0

    @property
    def padded(self) -> bool:
        """The plain form with each tap's C channels padded to whole 64-channel boxes (``C % 64 != 0``)."""
        return not self.boxed and self.c % BOX != 0

    @property
    def cp(self) -> int:
        """A tap's GEMM columns in the plain form: C rounded up to whole boxes."""
        return -(-self.c // BOX) * BOX

    @property
    def gemm_groups(self) -> int:
        """GEMMs of the grid's z: the groups, or (boxed) the boxes of ``merge`` groups (the last maybe fewer)."""
        return -(-self.groups // self.merge) if self.boxed else self.groups

    @property
    def gemm_rows(self) -> int:
        """The GEMM's M: K, or (boxed) ``merge K``."""
        return self.merge * self.k if self.boxed else self.k

    @property
    def gemm_columns(self) -> int:
        """The GEMM's N: ``Y X C`` (``Y X Cp`` padded), or (boxed) one 64-channel box a tap."""
        return math.prod(self.filter) * (BOX if self.boxed else self.cp)

    @property
    def rank(self) -> int:
        """Spatial dims: 1, 2 or 3."""
        return len(self.stride)

    @property
    def spatial(self) -> tuple[int, ...]:
        """x's spatial sizes, outermost first (``(h, w)``, ``(w,)``, ``(d, h, w)``)."""
        return (self.d, self.h, self.w)[3 - self.rank :]

    @property
    def filter(self) -> tuple[int, ...]:
        """The filter's sizes, outermost first."""
        return (self.fz, self.fy, self.fx)[3 - self.rank :]

    @property
    def out(self) -> tuple[int, ...]:
        """dy's spatial sizes, outermost first."""
        return (self.do, self.ho, self.wo)[3 - self.rank :]

    @property
    def reduction(self) -> int:
        return self.n * math.prod(self.out)

    def corners(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """x's im2col bounding box per image, innermost first (:func:`convbw_mlir.cuda_launch.im2col_corners`)."""
        return im2col_corners(self.spatial, self.out, self.stride, self.pad)

    @property
    def columns(self) -> int:
        """dW's columns ``Y X C`` (``Z Y X C``, ``X C``: the GEMM's N)."""
        return math.prod(self.filter) * self.c

    @property
    def ktiles(self) -> int:
        return -(-self.reduction // self.tiling.bk)

    @property
    def chunk(self) -> int:
        """k tiles a split (the last takes the rest)."""
        return -(-self.ktiles // self.splits)

    @property
    def tiles(self) -> tuple[int, int]:
        """Column tiles, row tiles."""
        return -(-self.gemm_columns // self.tiling.bn), -(-self.gemm_rows // self.tiling.bm)

    @property
    def units(self) -> int:
        """Work units: tiles x splits x groups."""
        return self.tiles[0] * self.tiles[1] * self.splits * self.gemm_groups

    @property
    def sk_total(self) -> int:
        """StreamK's iterations: every tile's k tiles, end to end."""
        return self.tiles[0] * self.tiles[1] * self.gemm_groups * self.ktiles

    def sk_begin(self, w: int) -> int:
        """The first iteration of StreamK workgroup ``w`` (``w = streamk``: the end)."""
        return w * self.sk_total // self.streamk

    @property
    def counters(self) -> int:
        """The fused split's arrival counters: one a consumer thread of every tile."""
        return self.tiles[0] * self.tiles[1] * self.gemm_groups * self.tiling.consumers * WARPGROUP

    @property
    def sk_partials(self) -> list[int]:
        """StreamK's workspace: ``[workgroups, consumers, bn / 8, 128 threads, 4]`` f32."""
        return [self.streamk, self.tiling.consumers, self.tiling.bn // 8, WARPGROUP, 4]

    @property
    def grid(self) -> tuple[int, int, int]:
        if self.streamk:
            return (self.streamk, 1, 1)
        if self.tiling.persistent:
            return (self.tiling.persistent, 1, 1)
        return (*self.tiles, self.splits * self.gemm_groups)

    @property
    def flops(self) -> int:
        return 2 * self.k * self.columns * self.reduction


def from_problem(problem: Any, tiling: Sm90Tiling | None = None, splits: int = 1, streamk: int = 0,
                 merge: int = 0) -> ConvSm90:  # fmt: skip
    """The kernel's numbers for a layout-2 ``problem`` (a ``ConvBwdWeightProblem`` of rank 1, 2 or 3; ``tiling``:
    the default :class:`Sm90Tiling` unless given; ``streamk``: workgroups of a StreamK grid, 0 none; ``merge``:
    groups a box of the boxed form, 0 the plain form)."""
    pad = (1,) * (3 - problem.rank)
    d, h, w = (*pad, *problem.input_size)
    fz, fy, fx = (*pad, *problem.filter_size)
    do, ho, wo = (*pad, *problem.output_size)
    return ConvSm90(problem.batch, h, w, problem.in_channels, problem.out_channels, fy, fx, ho, wo,
                    tuple(problem.stride), tuple(problem.dilation), tuple(problem.pad_low),
                    tiling or Sm90Tiling(), splits, problem.groups, d, fz, do, streamk, merge=merge)  # fmt: skip


def descriptor_mn(address: int, lead: int) -> int:
    """The wgmma matrix descriptor of an MN-major, 128-byte-swizzled tile at shared ``address`` (PTX ISA
    "Matrix Descriptor Format"; CUTLASS's canonical MN-major SW128 layout): start >> 4 in bits 0-13, the
    leading byte offset (``lead``: from one 64-element MN atom to the next) >> 4 in 16-29, the stride byte
    offset (1024: the next 8 reduction rows) >> 4 in 32-45, swizzle mode 1 (128 bytes) in 62-63."""
    atom = ATOM_ROWS * SWIZZLE_BYTES
    return ((address & 0x3FFFF) >> 4) | ((lead >> 4) << 16) | ((atom >> 4) << 32) | (1 << 62)


@dataclass(frozen=True)
class _WritableEntry(KernelEntry):
    """StreamK's bindings: dy, x and the maps read-only; partials, flags and dW written."""

    def layout(self) -> ir.Attribute:
        entries = ["#hal.pipeline.binding<storage_buffer, ReadOnly>"] * 3
        entries += ["#hal.pipeline.binding<storage_buffer>"] * (len(self.bindings) - 3)
        return ir.Attribute.parse(f"#hal.pipeline.layout<bindings = [{', '.join(entries)}]>")


def conv_entry(g: ConvSm90, elem: ir.Type, out: ir.Type, name: str = "conv_sm90") -> KernelEntry:
    """The kernel's launch: grid (N tiles, M tiles, groups x splits), bindings dy ``[N Ho Wo, G K]``, x
    ``[N, H, W, G C]`` (``[N, W, G C]``, ``[N, D, H, W, G C]``), maps (dy's then x's CUtensorMap), dW ``[G, K,
    Y X C]`` (or its f32 partials ``[splits, G, K, Y X C]``); StreamK: grid (workgroups), partials and flags
    ``[workgroups, consumers]`` (i32) before dW."""
    c_shape = [g.groups, g.k, g.columns] if g.splits == 1 else [g.splits, g.groups, g.k, g.columns]
    inputs = (
        ir.MemRefType.get([g.reduction, g.groups * g.k], elem),
        ir.MemRefType.get([g.n, *g.spatial, g.groups * g.c], elem),  # x at its own rank
        ir.MemRefType.get([256], ir.IntegerType.get_signless(8)),
    )
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    entry, written = KernelEntry, (ir.MemRefType.get(c_shape, out if g.splits == 1 else f32),)
    if g.fused:  # partials and counters written, then dW
        entry = _WritableEntry
        written = (ir.MemRefType.get(c_shape, f32), ir.MemRefType.get([g.counters], i32),
                   ir.MemRefType.get([g.groups, g.k, g.columns], out))  # fmt: skip
    elif g.streamk:  # partials and flags written, then dW
        entry = _WritableEntry
        written = (ir.MemRefType.get(g.sk_partials, f32), ir.MemRefType.get([g.streamk, g.tiling.consumers], i32),
                   ir.MemRefType.get(c_shape, out))  # fmt: skip
    return entry(executable=name, function=name, grid=g.grid, workgroup_size=(g.tiling.threads, 1, 1),
                 subgroup_size=32, bindings=(*inputs, *written))  # fmt: skip


def _producer(b: Ints, g: ConvSm90, pipe: Pipeline, maps: ir.Value, m0: ir.Value, n0: ir.Value, first: ir.Value,
              count: ir.Value, ring: ir.Value, group: ir.Value) -> None:  # fmt: skip
    """One thread's loop over the split's k tiles ``first .. first + count - 1``: wait for the slot's
    empty phase, announce the bytes, then per consumer a 64 x 64 dy box and per 64 columns an im2col box
    of x (its tap's offsets, one a spatial dim, from the 64 output positions of the k tile). ``ring``: the
    workgroup's k tiles before this unit's (index; a persistent workgroup's ring runs on across its units)."""
    t = g.tiling
    map_dy, map_x = global_ptr(b, maps, 0), global_ptr(b, maps, 128)
    cluster = ir.Type.parse("!llvm.ptr<7>")
    i16 = ir.IntegerType.get_signless(16)
    mode = ir.Attribute.parse("#nvvm.tma_load_mode<im2col>")
    # each box's tap and first channel: column n0 + 64 j of the GEMM (past its columns: any valid one, never stored)
    taps = []
    for j in range(t.bn // BOX):
        col = arith.remui(arith.addi(n0, b.c(BOX * j)), b.c(g.gemm_columns))
        if g.boxed:  # one box a tap from the first merged group's first channel (past G C: TMA reads zeros)
            c0, tap = arith.muli(group, b.c(g.merge * g.c)), arith.divui(col, b.c(BOX))
        else:  # the group's channels (padded: past C, channels never stored)
            c0, tap = arith.addi(arith.muli(group, b.c(g.c)), arith.remui(col, b.c(g.cp))), arith.divui(col, b.c(g.cp))
        # the tap's im2col offsets, innermost dim first: its filter position times the dilation
        at = _digits(b, tap, g.filter)
        taps.append((c0, [arith.trunci(i16, arith.muli(f, b.c(dil))) for f, dil in zip(at, g.dilation[::-1])]))
    with for_(arith.constant(b.index, 0), arith.index_cast(b.index, count), arith.constant(b.index, 1)) as loop:
        i = loop.iv
        slot = pipe.acquire(arith.addi(ring, i))
        a, bb = slot.a, slot.b
        full_p = pipe.commit(slot)
        r0 = arith.muli(arith.addi(first, arith.index_cast(b.i32, i)), b.c(t.bk))
        for cons in range(t.consumers):
            dst = llvm.addrspacecast(cluster, b.ptr(arith.addi(a, b.c(cons * WGMMA_M * SWIZZLE_BYTES)), 3))
            row = arith.addi(arith.addi(arith.muli(group, b.c(g.gemm_rows)), m0), b.c(cons * WGMMA_M))
            nvvm.cp_async_bulk_tensor_shared_cluster_global(dst, map_dy, [row, r0], full_p, [])
        # the k tile's first output position (n, (do,) ho, wo) -> its pixel in the bounding box, innermost first
        per_image = math.prod(g.out)
        img, pos = arith.divui(r0, b.c(per_image)), arith.remui(r0, b.c(per_image))
        at = _digits(b, pos, g.out)
        pixel = [arith.subi(arith.muli(o, b.c(s)), b.c(p)) for o, s, p in zip(at, g.stride[::-1], g.pad[::-1])]
        for j, (c0, offsets) in enumerate(taps):
            dst = llvm.addrspacecast(cluster, b.ptr(arith.addi(bb, b.c(j * t.bk * SWIZZLE_BYTES)), 3))
            nvvm.cp_async_bulk_tensor_shared_cluster_global(dst, map_x, [c0, *pixel, img], full_p, offsets, mode=mode)


def _digits(b: Ints, value: ir.Value, sizes: tuple[int, ...]) -> list[ir.Value]:
    """``value`` (i32, below ``prod(sizes)``) as its mixed-radix digits over ``sizes`` (outermost first),
    innermost first (a tap's filter position, an output position)."""
    out = []
    for size in sizes[::-1]:
        out.append(arith.remui(value, b.c(size)) if size > 1 else b.c(0))
        value = arith.divui(value, b.c(size)) if size > 1 else value
    return out


def _wgmma(b: Ints, g: ConvSm90, acc: ir.Value, a: ir.Value, bb: ir.Value, a_rows: ir.Value, elem: str) -> ir.Value:
    """The consumer's k tile: ``bk / 16`` wgmma m64n{bn}k16, both operands MN-major (A ``col``, B ``row``:
    the transpose bits), each k16 step two swizzle atoms (2048 bytes) further down the reduction rows."""
    t = g.tiling
    a_bits = b.c(descriptor_mn(0, t.bk * SWIZZLE_BYTES), b.i64)
    b_bits = b.c(descriptor_mn(0, t.bk * SWIZZLE_BYTES), b.i64)  # B's 64-column boxes lie bk rows apart

    def desc(addr: ir.Value, bits: ir.Value) -> ir.Value:
        return arith.ori(arith.shrui(arith.extui(b.i64, addr), b.c(4, b.i64)), bits)

    da, db = desc(arith.addi(a, a_rows), a_bits), desc(bb, b_bits)
    attr = ir.Attribute.parse
    for kk in range(t.bk // WGMMA_K):
        step = b.c(kk * 2 * ATOM_ROWS * SWIZZLE_BYTES // 16, b.i64)
        acc = nvvm.wgmma_mma_async(
            acc_type(t), acc, arith.addi(da, step), arith.addi(db, step),
            attr(f"#nvvm.shape<m = 64, n = {t.bn}, k = 16>"), attr(f"#nvvm.wgmma_type<{elem}>"),
            attr(f"#nvvm.wgmma_type<{elem}>"), attr("#nvvm.wgmma_type<f32>"), attr("#nvvm.wgmma_scale_out<one>"),
            attr("#nvvm.wgmma_scale_in<one>"), attr("#nvvm.wgmma_scale_in<one>"),
            attr("#nvvm.mma_layout<col>"), attr("#nvvm.mma_layout<row>"),
        )  # fmt: skip
    return acc


def _consumer(b: Ints, g: ConvSm90, pipe: Pipeline, a_rows: ir.Value, count: ir.Value, elem: str,
              ring: ir.Value) -> ir.Value:  # fmt: skip
    """Warpgroup loop over the split's k tiles, one wgmma group in flight (gemm_sm90's), ``count`` at run
    time (the last split is shorter); returns the accumulators, its last stage released."""
    t = g.tiling
    n = arith.index_cast(b.index, count)
    with for_(arith.constant(b.index, 0), n, arith.constant(b.index, 1), [zero_acc(b, t)]) as loop:
        i = loop.iv
        slot = pipe.wait(arith.addi(ring, i))
        nvvm.wgmma_fence_aligned()
        acc = _wgmma(b, g, loop.args[0], slot.a, slot.b, a_rows, elem)
        nvvm.wgmma_commit_group_sync_aligned()
        nvvm.wgmma_wait_group_sync_aligned(1)  # k tile i - 1's group is done: its slot can be refilled
        with if_(arith.cmpi(arith.CmpIPredicate.ugt, i, arith.constant(b.index, 0))):
            pipe.release(arith.subi(arith.addi(ring, i), arith.constant(b.index, 1)))
        loop.yield_(acc)
    nvvm.wgmma_wait_group_sync_aligned(0)
    pipe.release(arith.subi(arith.addi(ring, n), arith.constant(b.index, 1)))
    return loop.results[0]


def _epilogue(b: Ints, g: ConvSm90, c: ir.Value, acc: ir.Value, wtid: ir.Value, row0: ir.Value, n0: ir.Value,
              split: ir.Value | None, group: ir.Value, pair_of=None) -> None:  # fmt: skip
    """Each accumulator pair to dW (or to its split's partials), per 64-column box only where the box lies
    inside the GEMM's columns (padded: per 8-column chunk only where its channel is below C, at dW's column
    ``tap C + channel``); ``pair_of(row, column)``: the f32 pair to store there instead of the accumulators'
    (the fused split's sum)."""
    t = g.tiling
    out = ir.MemRefType(c.type).element_type
    f32 = ir.F32Type.get()
    idx = b.index

    def k(v: int) -> ir.Value:
        return arith.constant(idx, v)

    warp, lane = arith.divui(wtid, k(32)), arith.remui(wtid, k(32))
    row = arith.addi(row0, arith.addi(arith.muli(warp, k(16)), arith.divui(lane, k(4))))
    col = arith.addi(n0, arith.muli(arith.remui(lane, k(4)), k(2)))
    per_box = BOX // 2  # accumulators of one 64-column box

    def store(v: int, r: ir.Value, cc: ir.Value) -> None:
        if pair_of is None:
            pair = [llvm.extractvalue(f32, acc, ir.DenseI64ArrayAttr.get([v + e])) for e in range(2)]
            vec = vector.from_elements(ir.VectorType.get([2], f32), pair)
        else:
            vec = pair_of(r, cc)
        if out != f32:
            vec = arith.truncf(ir.VectorType.get([2], out), vec)
        vector.store(vec, c, [group, r, cc] if split is None else [split, group, r, cc])

    for j in range(t.bn // BOX):
        start = arith.addi(n0, k(BOX * j))
        if g.padded:  # the box's tap and first channel; dW's column of that channel
            within = arith.remui(start, k(g.cp))
            shift = arith.subi(arith.addi(arith.muli(arith.divui(start, k(g.cp)), k(g.c)), within), start)
        with if_(arith.cmpi(arith.CmpIPredicate.ult, start, k(g.gemm_columns))):
            for half in (0, 1):  # rows ``row`` and ``row + 8``: each inside K or not (K % 8 == 0 only)
                r = arith.addi(row, k(8 * half))
                with if_(arith.cmpi(arith.CmpIPredicate.ult, r, k(g.k))):
                    for v in range(per_box * j + 2 * half, per_box * (j + 1), 4):
                        cc = arith.addi(col, k(8 * (v // 4)))
                        if not g.padded:
                            store(v, r, cc)
                            continue
                        # padded: an 8-column chunk lies wholly below C or wholly past it (C % 8 == 0)
                        chunk = arith.addi(within, k(8 * (v // 4) - BOX * j))
                        with if_(arith.cmpi(arith.CmpIPredicate.ult, chunk, k(g.c))):
                            store(v, r, arith.addi(cc, shift))


def _boxed_epilogue(b: Ints, g: ConvSm90, c: ir.Value, acc: ir.Value, wtid: ir.Value, row0: ir.Value, n0: ir.Value,
                    split: ir.Value | None, group: ir.Value) -> None:  # fmt: skip
    """The boxed form's store: each accumulator pair whose GEMM row ``i K + k`` and column ``tap 64 + j C + c``
    meet in a diagonal block (``i == j``, group ``group m + i`` inside G, the tap inside the filter) goes to dW
    ``[group m + i, k, tap C + c]`` (C even: a pair never straddles two groups); the rest is dropped."""
    t = g.tiling
    out = ir.MemRefType(c.type).element_type
    f32, idx = ir.F32Type.get(), b.index

    def k(v: int) -> ir.Value:
        return arith.constant(idx, v)

    def lt(a: ir.Value, bound: int) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ult, a, k(bound))

    warp, lane = arith.divui(wtid, k(32)), arith.remui(wtid, k(32))
    row = arith.addi(row0, arith.addi(arith.muli(warp, k(16)), arith.divui(lane, k(4))))
    col = arith.addi(n0, arith.muli(arith.remui(lane, k(4)), k(2)))
    first = arith.muli(group, k(g.merge))  # the box's first group
    columns = []  # per n8 chunk: (inside the filter's taps, its group in the box, dW's column)
    for q in range(t.bn // 8):
        cc = arith.addi(col, k(8 * q))
        tap, ch = arith.divui(cc, k(BOX)), arith.remui(cc, k(BOX))
        dw_col = arith.addi(arith.muli(tap, k(g.c)), arith.remui(ch, k(g.c)))
        columns.append((lt(cc, g.gemm_columns), arith.divui(ch, k(g.c)), dw_col))
    for half in (0, 1):  # rows ``row`` and ``row + 8``
        r = arith.addi(row, k(8 * half))
        gi, kk = arith.divui(r, k(g.k)), arith.remui(r, k(g.k))
        grp = arith.addi(first, gi)
        row_ok = arith.andi(lt(r, g.gemm_rows), lt(grp, g.groups))
        for q, (col_ok, gj, dw_col) in enumerate(columns):
            same = arith.cmpi(arith.CmpIPredicate.eq, gi, gj)
            with if_(arith.andi(arith.andi(row_ok, col_ok), same)):
                v = 4 * q + 2 * half
                pair = [llvm.extractvalue(f32, acc, ir.DenseI64ArrayAttr.get([v + e])) for e in range(2)]
                vec = vector.from_elements(ir.VectorType.get([2], f32), pair)
                if out != f32:
                    vec = arith.truncf(ir.VectorType.get([2], out), vec)
                vector.store(vec, c, [grp, kk, dw_col] if split is None else [split, grp, kk, dw_col])


def build_conv_body(entry: ir.Block, bindings: list[ir.Value], g: ConvSm90) -> None:
    """Emit the kernel into ``entry`` given its bound memrefs (dy, x, maps, dW) for :func:`conv_entry`'s grid.

    Raises:
        ValueError: an input type other than f16 or bf16.
    """
    if g.streamk or g.fused:
        dy, _, maps, partials, flags, c = bindings
    else:
        (dy, _, maps, c), partials, flags = bindings, None, None
    elem = str(ir.MemRefType(dy.type).element_type)
    if elem not in ("f16", "bf16"):
        raise ValueError(f"dtype: {elem!r}: the sm_90a kernel takes f16 or bf16")
    t = g.tiling
    b = Ints()
    idx = b.index
    tid = gpu.thread_id(gpu.Dimension.x)
    wg = arith.divui(tid, arith.constant(idx, WARPGROUP))
    pipe = Pipeline(b, t, shared_base(b, t))
    pipe.init(tid)
    # setmaxnreg acts only where each warpgroup's role is one branch of a single if/else (HOPPER.md)
    with if_(arith.cmpi(arith.CmpIPredicate.eq, wg, arith.constant(idx, 0)), else_=True) as role:
        if t.producer_regs:
            nvvm.setmaxregister(t.producer_regs, ir.Attribute.parse("#nvvm.action<decrease>"))
        with if_(arith.cmpi(arith.CmpIPredicate.eq, tid, arith.constant(idx, 0))):
            for (m0, n0, _, group, first, count), ring, _ in _units(b, g):
                m32, n32 = arith.index_cast(b.i32, m0), arith.index_cast(b.i32, n0)
                _producer(b, g, pipe, maps, m32, n32, first, count, ring, arith.index_cast(b.i32, group))
    with role.otherwise():
        if t.consumer_regs:
            nvvm.setmaxregister(t.consumer_regs, ir.Attribute.parse("#nvvm.action<increase>"))
        consumer = arith.subi(wg, arith.constant(idx, 1))
        wtid = arith.remui(tid, arith.constant(idx, WARPGROUP))
        a_rows = arith.index_cast(b.i32, arith.muli(consumer, arith.constant(idx, WGMMA_M * SWIZZLE_BYTES)))
        for (m0, n0, split, group, _, count), ring, sk in _units(b, g):
            acc = _consumer(b, g, pipe, a_rows, count, elem, ring)
            row0 = arith.addi(m0, arith.muli(consumer, arith.constant(idx, WGMMA_M)))
            with if_(arith.cmpi(arith.CmpIPredicate.ult, row0, arith.constant(idx, g.gemm_rows))):
                if g.boxed:
                    _boxed_epilogue(b, g, c, acc, wtid, row0, n0, split if g.splits > 1 else None, group)
                elif g.fused:
                    _fused_split(b, g, c, partials, flags, acc, wtid, consumer, row0, m0, n0, split, group)
                elif sk is None:
                    _epilogue(b, g, c, acc, wtid, row0, n0, split if g.splits > 1 else None, group)
                else:
                    _streamk_seam(b, g, c, partials, flags, acc, wtid, consumer, row0, n0, group, sk)


def _unit(b: Ints, g: ConvSm90, n_tile: ir.Value, m_tile: ir.Value, z: ir.Value) -> tuple[ir.Value, ...]:
    """(first row, first column, split, group (index), first k tile, k tiles (i32)) of a work unit (index
    ids; ``z``: group x splits + split)."""
    idx, t = b.index, g.tiling
    split, group = arith.remui(z, arith.constant(idx, g.splits)), arith.divui(z, arith.constant(idx, g.splits))
    first = arith.muli(arith.index_cast(b.i32, split), b.c(g.chunk))
    count = arith.minsi(b.c(g.chunk), arith.subi(b.c(g.ktiles), first))
    m0 = arith.muli(m_tile, arith.constant(idx, t.bm))
    return m0, arith.muli(n_tile, arith.constant(idx, t.bn)), split, group, first, count


def _units(b: Ints, g: ConvSm90):
    """The workgroup's work units, each with the k tiles of its ring before it (index) and StreamK's seam
    (or None): its block ids, or (persistent) a loop over units ``id, id + persistent, ...`` (column tile
    fastest, then row tile, then split, then group; one iteration yielded inside the ``scf.for``, the ring
    carried by it), or StreamK's segments (:func:`_streamk_units`)."""
    idx = b.index

    def c(v: int) -> ir.Value:
        return arith.constant(idx, v)

    if g.streamk:
        yield from _streamk_units(b, g)
        return
    if not g.tiling.persistent:
        ids = [gpu.block_id(d) for d in (gpu.Dimension.x, gpu.Dimension.y, gpu.Dimension.z)]
        yield _unit(b, g, *ids), c(0), None
        return
    n_tiles, m_tiles = g.tiles
    with for_(gpu.block_id(gpu.Dimension.x), c(g.units), c(g.tiling.persistent), [c(0)]) as loop:
        u, ring = loop.iv, loop.args[0]
        tile, z = arith.remui(u, c(n_tiles * m_tiles)), arith.divui(u, c(n_tiles * m_tiles))
        unit = _unit(b, g, arith.remui(tile, c(n_tiles)), arith.divui(tile, c(n_tiles)), z)
        yield unit, ring, None
        loop.yield_(arith.addi(ring, arith.index_cast(idx, unit[5])))


def _fused_split(b: Ints, g: ConvSm90, c: ir.Value, partials: ir.Value, counters: ir.Value, acc: ir.Value,
                 wtid: ir.Value, consumer: ir.Value, row0: ir.Value, m0: ir.Value, n0: ir.Value, split: ir.Value,
                 group: ir.Value) -> None:  # fmt: skip
    """The split's second stage in the kernel, one thread at a time (its fragment's places are the same in
    every split): store the partial, ``membar.gl``, count in on the thread's own counter (atomic, acq_rel);
    the thread that arrives last adds the splits' partials at its places, writes dW and puts its counter
    back to zero. No barrier: each thread reads only what it wrote itself in every split."""
    idx = b.index
    f32, v2 = ir.F32Type.get(), ir.VectorType.get([2], ir.F32Type.get())

    def k(v: int) -> ir.Value:
        return arith.constant(idx, v)

    _epilogue(b, g, partials, acc, wtid, row0, n0, split, group)
    gpu_fence()
    n_tiles, m_tiles = g.tiles
    tile = arith.addi(arith.muli(arith.addi(arith.muli(group, k(m_tiles)), arith.divui(m0, k(g.tiling.bm))),
                                 k(n_tiles)), arith.divui(n0, k(g.tiling.bn)))  # fmt: skip
    at = arith.addi(arith.muli(arith.addi(arith.muli(tile, k(g.tiling.consumers)), consumer), k(WARPGROUP)), wtid)
    seen = memref.atomic_rmw(arith.AtomicRMWKind.addi, b.c(1), counters, [at])
    with if_(arith.cmpi(arith.CmpIPredicate.eq, seen, b.c(g.splits - 1))):
        gpu_fence()

        def pair_of(r: ir.Value, cc: ir.Value) -> ir.Value:
            zero = arith.constant(v2, ir.DenseElementsAttr.get_splat(v2, ir.FloatAttr.get(f32, 0.0)))
            with for_(k(0), k(g.splits), k(1), [zero]) as each:
                part = vector.load(v2, partials, [each.iv, group, r, cc])
                each.yield_(arith.addf(each.args[0], part))
            return each.results[0]

        _epilogue(b, g, c, acc, wtid, row0, n0, None, group, pair_of)
        memref.atomic_rmw(arith.AtomicRMWKind.addi, b.c(-g.splits), counters, [at])  # zero for the next launch


def _streamk_units(b: Ints, g: ConvSm90):
    """StreamK's segments of this workgroup's range ``[w T / W, (w + 1) T / W)``, its last tile first (so a
    contributor's partial, the range's last segment, is stored before its first segment waits on others):
    the unit (split 0, first k tile and count inside the tile) and the seam ``(hi, first contributor, w)``,
    ``hi`` the segment's end inside its tile (``ktiles``: it finishes the tile)."""
    idx = b.index

    def c(v: int) -> ir.Value:
        return arith.constant(idx, v)

    total, wgs, iters = g.sk_total, g.streamk, g.ktiles
    n_tiles, m_tiles = g.tiles
    w = gpu.block_id(gpu.Dimension.x)
    begin = arith.divui(arith.muli(w, c(total)), c(wgs))
    end = arith.divui(arith.muli(arith.addi(w, c(1)), c(total)), c(wgs))
    last = arith.divui(arith.subi(end, c(1)), c(iters))
    with for_(c(0), arith.subi(arith.addi(last, c(1)), arith.divui(begin, c(iters))), c(1), [c(0)]) as loop:
        ring = loop.args[0]
        tile = arith.subi(last, loop.iv)
        start = arith.muli(tile, c(iters))
        lo = arith.subi(arith.maxui(begin, start), start)
        hi = arith.subi(arith.minui(end, arith.addi(start, c(iters))), start)
        # the owner of the tile's first iteration: the largest w' with w' T / W <= start
        first_w = arith.divui(arith.subi(arith.muli(arith.addi(start, c(1)), c(wgs)), c(1)), c(total))
        n_tile, rest = arith.remui(tile, c(n_tiles)), arith.divui(tile, c(n_tiles))
        m_tile, group = arith.remui(rest, c(m_tiles)), arith.divui(rest, c(m_tiles))
        count = arith.index_cast(b.i32, arith.subi(hi, lo))
        unit = (arith.muli(m_tile, c(g.tiling.bm)), arith.muli(n_tile, c(g.tiling.bn)), c(0), group,
                arith.index_cast(b.i32, lo), count)  # fmt: skip
        yield unit, ring, (hi, first_w, w)
        loop.yield_(arith.addi(ring, arith.index_cast(idx, count)))


def _streamk_seam(b: Ints, g: ConvSm90, c: ir.Value, partials: ir.Value, flags: ir.Value, acc: ir.Value,
                  wtid: ir.Value, consumer: ir.Value, row0: ir.Value, n0: ir.Value, group: ir.Value,
                  seam: tuple[ir.Value, ir.Value, ir.Value]) -> None:  # fmt: skip
    """A StreamK segment's end for one consumer warpgroup: the finisher (``hi`` = the tile's last k tile)
    adds its contributors' partials (waiting on their flags) and stores dW; a contributor stores its partial
    and raises its flag. The warpgroup's own named barrier (1 + consumer, 128 threads) orders its threads'
    partial stores before the flag, and the flag before their loads."""
    hi, first_w, w = seam
    idx, f32, i32 = b.index, ir.F32Type.get(), ir.IntegerType.get_signless(32)
    v4 = ir.VectorType.get([4], f32)

    def k(v: int) -> ir.Value:
        return arith.constant(idx, v)

    leader = arith.cmpi(arith.CmpIPredicate.eq, wtid, k(0))
    bar_id = arith.index_cast(i32, arith.addi(consumer, k(1)))

    def sync() -> None:
        nvvm.barrier(barrier_id=bar_id, number_of_threads=b.c(WARPGROUP), aligned=True)

    with if_(arith.cmpi(arith.CmpIPredicate.eq, hi, k(g.ktiles)), else_=True) as finishes:
        with if_(arith.cmpi(arith.CmpIPredicate.ult, first_w, w), [acc.type]) as others:
            with if_(leader):
                with for_(first_w, w, k(1)) as each:  # the leader waits for each contributor's flag
                    at = [each.iv, consumer]
                    with while_() as spin:
                        seen = memref.atomic_rmw(arith.AtomicRMWKind.addi, b.c(0), flags, at)
                        spin.again_if(arith.cmpi(arith.CmpIPredicate.eq, seen, b.c(0)))
                    memref.atomic_rmw(arith.AtomicRMWKind.addi, b.c(-1), flags, at)  # back to zero for the next launch
                gpu_fence()
            sync()
            gpu_fence()
            with for_(first_w, w, k(1), [acc]) as add:  # the contributors' partials, in workgroup order
                total = add.args[0]
                for j in range(g.tiling.bn // 8):
                    part = vector.load(v4, partials, [add.iv, consumer, k(j), wtid, k(0)])
                    for e in range(4):
                        pos = ir.DenseI64ArrayAttr.get([4 * j + e])
                        mine = llvm.extractvalue(f32, total, pos)
                        total = llvm.insertvalue(total, arith.addf(mine, vector.extract(part, [], [e])), pos)
                add.yield_(total)
            others.yield_(add.results[0])
        with others.otherwise():
            others.yield_(acc)
        _epilogue(b, g, c, others.results[0], wtid, row0, n0, None, group)
    with finishes.otherwise():  # a contributor: its partial out, then its flag
        for j in range(g.tiling.bn // 8):
            vals = [llvm.extractvalue(f32, acc, ir.DenseI64ArrayAttr.get([4 * j + e])) for e in range(4)]
            vector.store(vector.from_elements(v4, vals), partials, [w, consumer, k(j), wtid, k(0)])
        gpu_fence()
        sync()  # every thread's partial is out before the leader raises the flag
        with if_(leader):
            memref.atomic_rmw(arith.AtomicRMWKind.addi, b.c(1), flags, [w, consumer])


def conv_module(g: ConvSm90, dtype: str = "f16", out: str = "f32") -> ir.Module:
    """``@main(dy: [N Ho Wo, K], x: [N, H, W, C] (1-D: [N, W, C], 3-D: [N, D, H, W, C]), maps: 256 x i8) -> dW
    [K, Y X C]`` (or its partials) dispatching the kernel (in the current context)."""
    from iree.compiler.dialects import func

    from convbw_mlir.kernels.entry import build_dispatch

    entry = conv_entry(g, ir.Type.parse(dtype), ir.Type.parse(out))
    module = ir.Module.create()
    tensors = [ir.RankedTensorType.get(ir.MemRefType(x).shape, ir.MemRefType(x).element_type) for x in entry.bindings]
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("main", ir.FunctionType.get(tensors[:3], [tensors[-1]]))
        block = fn.add_entry_block()
    with ir.InsertionPoint(block):
        if g.streamk or g.fused:
            top = ir.InsertionPoint.at_block_begin(module.body)
            func.ReturnOp([build_streamk_dispatch(g, entry, list(block.arguments), top)])
            return module
        result = build_dispatch(
            entry, lambda blk, mems: build_conv_body(blk, mems, g), list(block.arguments), tensors[3],
            ir.InsertionPoint.at_block_begin(module.body),
        )  # fmt: skip
        func.ReturnOp([result])
    return module


def build_streamk_dispatch(g: ConvSm90, entry: KernelEntry, operands: list[ir.Value],
                           module_ip: ir.InsertionPoint) -> ir.Value:  # fmt: skip
    """StreamK's (or the fused split's) executable (at ``module_ip``) and its ``flow.dispatch`` on ``operands``
    (dy, x, maps) here; returns dW. The partials (never read before written: uninitialized) and the flags or
    counters (zeroed by a fill; the kernel leaves them zero) are tied to results, so IREE binds dy, x, maps,
    partials, flags, dW."""
    from iree.compiler.dialects import flow, linalg, tensor

    from convbw_mlir.kernels.entry import _build_executable

    with module_ip:
        _build_executable(entry, lambda blk, mems: build_conv_body(blk, mems, g))
    types = [ir.RankedTensorType.get(ir.MemRefType(m).shape, ir.MemRefType(m).element_type) for m in entry.bindings]

    def fresh(t: ir.RankedTensorType) -> ir.Value:  # a per-call buffer: IREE hoists a bare one into a global
        empty = tensor.EmptyOp(t.shape, t.element_type).result
        return ir.Operation.create("util.optimization_barrier", results=[t], operands=[empty]).result

    partials = fresh(types[3])
    flags = linalg.fill(arith.constant(types[4].element_type, 0), outs=[fresh(types[4])])
    tied = ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IndexType.get(), v) for v in (-1, 3, 4)])
    target = ir.SymbolRefAttr.get([entry.executable, entry.function])
    op = flow.DispatchOp([types[5], types[3], types[4]], [], ir.ArrayAttr.get([target]),
                         [*operands, partials, flags], [], [], tied_operands=tied)  # fmt: skip
    return op.results[0]
