"""The sm_90a GEMM of the explicit strategy: wgmma, TMA and an mbarrier ring, warp-specialized.

``C[m, n] = sum_k A[m, k] * B[n, k]`` (A = dy, B = x of a 1x1 layout-4 weight gradient: both K-contiguous),
f16 or bf16 in, f32 accumulate, f32 or the input type out; or fp8 in (A e4m3 or e5m2, B e4m3 or e5m2:
the transposed copies an fp8 recipe's quantize step writes, since 8-bit wgmma takes K-major operands only),
``C = scale_a * scale_b * acc`` from a ``scales`` binding (two f32), f32 or bf16 out; ``promote`` adds each
k tile's wgmma partial into f32 registers (Hopper's fp8 wgmma does not accumulate in full f32).
docs/explicit-kernels.md "Hopper" has the design, the fp8 error bound and the numbers.

The recipe (CUTLASS's warp-specialized cooperative kernel, as the PTX ISA describes its parts):

- one **producer** warpgroup (threads 0-127) gives its registers away (``setmaxnreg.dec``) and one of its
  threads loads each k tile of A (``bm x bk``) and B (``bn x bk``) by TMA (``cp.async.bulk.tensor.2d``,
  128-byte swizzle: ``bk`` = 64 16-bit or 128 8-bit elements = one 128-byte row) into a ring of ``stages`` shared
  buffers; each stage has a *full* mbarrier (the TMA's bytes complete it: ``expect_tx``) and an *empty*
  one (every consumer thread arrives when its wgmmas have read the stage);
- ``consumers`` consumer warpgroups take the registers (``setmaxnreg.inc``); warpgroup ``c`` owns rows
  ``64c .. 64c+63`` of the tile and runs ``wgmma.mma_async.m64n{bn}k16`` (k32 for fp8) on shared-memory matrix
  descriptors (K-major, 128-byte swizzle, 8-row groups 1024 bytes apart), one wgmma group in flight: the
  stage of k tile ``kt - 1`` is released once ``wgmma.wait_group 1`` says its group is done;
- the epilogue stores the accumulators straight from registers (PTX ISA "wgmma .m64nNk16" D fragment:
  :func:`accumulator_coords`).

The tensor maps (CUtensorMap, 128 bytes each, A's then B's) arrive in a device buffer (the ``maps``
binding): IREE's HAL has no way to pass a 128-byte by-value kernel parameter, and ``cp.async.bulk.tensor``
takes a map in global memory too; the launcher encodes them (``cuTensorMapEncodeTiled``) for the buffers
it binds (bench/hopper_gemm.py). A and B are bound as well, unread by the kernel, so that IREE's dataflow
and the launch schedule keep their order.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, gpu, llvm, memref, nvvm, vector

from convbw_mlir.kernels.entry import KernelEntry
from convbw_mlir.kernels.ir import Ints, Pipeline, for_, if_

__all__ = [
    "FP8_TYPES",
    "SWIZZLE_BYTES",
    "WARPGROUP",
    "WGMMA_K",
    "WGMMA_M",
    "Sm90Tiling",
    "acc_type",
    "accumulator_coords",
    "build_gemm_body",
    "descriptor",
    "gemm_entry",
    "gemm_module",
    "global_ptr",
    "shared_base",
    "zero_acc",
]

WARPGROUP = 128
WGMMA_M, WGMMA_K = 64, 16
SWIZZLE_BYTES = 128  # one swizzled row: bk elements (64 16-bit, 128 8-bit)
STEP_BYTES = 32  # one wgmma's K along a row: k16 of 16-bit, k32 of 8-bit elements
# MLIR element type -> wgmma type; 8-bit types take K-major operands only (no transpose bits)
WGMMA_TYPES = {"f16": "f16", "bf16": "bf16", "f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}
FP8_TYPES = ("f8E4M3FN", "f8E5M2")
ATOM_BYTES = 8 * SWIZZLE_BYTES  # 8 rows: the 128-byte swizzle pattern's period, and the descriptor's stride


@dataclass(frozen=True)
class Sm90Tiling:
    """The numbers of one sm_90a GEMM kernel.

    Attributes:
        bn: columns of C a workgroup (the wgmma N: 8..256, a multiple of 8; TMA boxes hold 256 rows at most).
        consumers: consumer warpgroups, 64 rows of C each (``bm = 64 * consumers``).
        stages: shared-memory stages of the ring.
        bk: reduction step: one 128-byte swizzled row (64 16-bit or 128 8-bit elements; 0: that row).
        producer_regs, consumer_regs: ``setmaxnreg`` targets (multiples of 8 in 24..256); 0: no setmaxnreg.
        persistent: workgroups of a persistent grid (each takes tiles ``id, id + persistent, ...``, N
            fastest, its ring running on across them, so the producer loads the next tile's first stages
            while the consumers store the last one's); 0: one workgroup a tile.
        cluster: 2: workgroups in clusters of two (``.reqnctapercluster 2``) on M tiles ``2i, 2i + 1`` of
            one N tile; each loads half of the shared B tile by TMA multicast into both, so L2 serves
            B once for the pair; a stage's empty barrier then counts the consumer warps of both.
        elem_bytes: bytes of an input element (2: f16/bf16, 1: fp8).
        splits: split-K (grid z): split ``z`` takes k tiles ``z kt / splits ..``, and adds its f32 partial
            into C (``atomicrmw fadd``; the caller zeroes C): the weight gradient's few output tiles over
            a long reduction fill the GPU. Not with ``persistent`` or ``cluster``.
        promote: each k tile's wgmmas start a fresh partial (``scale-d`` 0) that is added into the f32
            accumulators once its group is done (``wgmma.wait_group 0``): Hopper's fp8 wgmma does not
            accumulate in full f32 (docs/explicit-kernels.md "fp8"); two accumulator sets, so bn <= 128.
    """

    bn: int = 256
    consumers: int = 2
    stages: int = 4
    bk: int = 0
    producer_regs: int = 40
    consumer_regs: int = 232
    persistent: int = 0
    cluster: int = 1
    elem_bytes: int = 2
    splits: int = 1
    promote: bool = False

    def __post_init__(self) -> None:
        if self.bn % 8 or not 8 <= self.bn <= 256:
            raise ValueError(f"bn: {self.bn} is not a wgmma N (8..256, a multiple of 8)")
        if self.elem_bytes not in (1, 2):
            raise ValueError(f"elem_bytes: {self.elem_bytes} (2: f16/bf16, 1: fp8)")
        if not self.bk:
            object.__setattr__(self, "bk", SWIZZLE_BYTES // self.elem_bytes)
        if self.bk * self.elem_bytes != SWIZZLE_BYTES:
            raise ValueError(f"bk: {self.bk}: the 128-byte swizzle takes {SWIZZLE_BYTES // self.elem_bytes} "
                             f"{8 * self.elem_bytes}-bit elements a row")  # fmt: skip
        if self.consumers not in (1, 2) or self.stages < 2:
            raise ValueError(f"consumers: {self.consumers}, stages: {self.stages} (1 or 2 consumers, 2+ stages)")
        if self.splits < 1 or (self.splits > 1 and (self.persistent or self.cluster > 1)):
            raise ValueError(f"splits: {self.splits} (1, or more without persistent or cluster)")
        if self.promote and self.bn > 128:
            raise ValueError(f"bn: {self.bn}: promote keeps two accumulator sets (bn <= 128)")
        if self.cluster not in (1, 2) or (self.cluster == 2 and (self.bn % 16 or self.persistent % 2)):
            raise ValueError(f"cluster: {self.cluster} (1, or 2 with bn a multiple of 16 and an even persistent grid)")

    @property
    def empty_count(self) -> int:
        """Arrivals that free a stage: every consumer thread; in a cluster, every consumer warp of both."""
        return WARPGROUP * self.consumers if self.cluster == 1 else self.cluster * 4 * self.consumers

    @property
    def bm(self) -> int:
        return WGMMA_M * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * (1 + self.consumers)

    @property
    def a_bytes(self) -> int:
        return self.bm * self.bk * self.elem_bytes

    @property
    def b_bytes(self) -> int:
        return self.bn * self.bk * self.elem_bytes

    @property
    def barriers(self) -> int:
        """Byte offset of the mbarriers (after the stages): full[s] at +8s, empty[s] at +8(stages + s)."""
        return self.stages * (self.a_bytes + self.b_bytes)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the stages, the barriers, and 1024 bytes to align the base to the swizzle."""
        return self.barriers + 16 * self.stages + ATOM_BYTES


def descriptor(address: int) -> int:
    """The wgmma matrix descriptor of a K-major, 128-byte-swizzled tile at shared ``address`` (PTX ISA
    "Matrix Descriptor Format": start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29 (unused
    by swizzled K-major: 1), stride byte offset >> 4 in 32-45 (1024: the next 8 rows), swizzle mode in
    62-63 (1: 128 bytes))."""
    return ((address & 0x3FFFF) >> 4) | (1 << 16) | ((ATOM_BYTES >> 4) << 32) | (1 << 62)


def accumulator_coords(n: int) -> list[tuple[int, int]]:
    """(row, column) of each accumulator of a warpgroup thread in an m64nNk16 wgmma, for threads 0..127:
    ``coords[v]`` are arrays over threads (PTX ISA "Matrix fragments for wgmma .m64nNk16", D: value ``v``
    lies in the n8 chunk ``v // 4``; row ``16 warp + lane / 4 (+8 for v % 4 >= 2)``, column
    ``8 (v // 4) + 2 (lane % 4) + v % 2``)."""
    import numpy as np

    t = np.arange(WARPGROUP)
    warp, lane = t // 32, t % 32
    return [(16 * warp + lane // 4 + 8 * ((v % 4) // 2), 8 * (v // 4) + 2 * (lane % 4) + v % 2) for v in range(n // 2)]


def gemm_entry(m: int, n: int, k: int, t: Sm90Tiling, elem: ir.Type, out: ir.Type,
               elem_b: ir.Type | None = None, scales: bool = True, partials: bool = False,
               name: str = "gemm_sm90") -> KernelEntry:  # fmt: skip
    """The kernel's launch: grid (N tiles, M tiles), 128 (1 + consumers) threads, bindings A, B, maps, C;
    fp8 (``elem``: A's type, ``elem_b``: B's, A's if None): A, B, maps, scales (scale_a, scale_b), C, or no
    scales binding (``scales`` False: the product's, whose scale is a constant of the problem's epilogue).
    ``partials``: C is ``[splits, M, N]`` f32, each split's partial in its own slice (no atomics; the
    product's split-K, summed in split order by its stage 2)."""
    fp8 = str(elem) in FP8_TYPES
    scales_t = (ir.MemRefType.get([2], ir.F32Type.get()),) if fp8 and scales else ()
    c_shape = [t.splits, m, n] if partials else [m, n]
    return KernelEntry(
        executable=name,
        function=name,
        grid=(t.persistent, 1, 1)
        if t.persistent
        else (t.cluster * -(-n // t.bn), -(-m // t.bm) // t.cluster, t.splits),
        workgroup_size=(t.threads, 1, 1),
        subgroup_size=32,
        bindings=(
            ir.MemRefType.get([m, k], elem),
            ir.MemRefType.get([n, k], elem_b or elem),
            ir.MemRefType.get([256], ir.IntegerType.get_signless(8)),
            *scales_t,
            ir.MemRefType.get(c_shape, out),
        ),
    )


def acc_type(t: Sm90Tiling) -> ir.Type:
    return ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (t.bn // 2)) + ")>")


def zero_acc(b: Ints, t: Sm90Tiling) -> ir.Value:
    acc = llvm.mlir_undef(acc_type(t))
    zero = arith.constant(ir.F32Type.get(), 0.0)
    for v in range(t.bn // 2):
        acc = llvm.insertvalue(acc, zero, ir.DenseI64ArrayAttr.get([v]))
    return acc


def shared_base(b: Ints, t: Sm90Tiling) -> ir.Value:
    """The i32 shared address of the kernel's dynamic shared memory, rounded up to 1024 (the swizzle atom:
    TMA and the descriptors address swizzled rows relative to it)."""
    shared = ir.Attribute.parse("#gpu.address_space<workgroup>")
    buf = memref.alloc(ir.MemRefType.get([t.shared_bytes], ir.IntegerType.get_signless(8), memory_space=shared), [], [])
    raw = arith.index_cast(b.i32, memref.extract_aligned_pointer_as_index(buf))
    return arith.andi(arith.addi(raw, b.c(ATOM_BYTES - 1)), b.c(-ATOM_BYTES))


def global_ptr(b: Ints, buf: ir.Value, offset: int) -> ir.Value:
    raw = arith.index_cast(b.i64, memref.extract_aligned_pointer_as_index(buf))
    return b.ptr(arith.addi(raw, b.c(offset, b.i64)) if offset else raw, 0)


def _producer(b: Ints, t: Sm90Tiling, pipe: Pipeline, maps: ir.Value, m0: ir.Value, n0: ir.Value, ktiles: int,
              ring: ir.Value, rank: ir.Value | None, k_first: ir.Value) -> None:  # fmt: skip
    """One thread's loop: acquire each k tile's slot, commit its bytes, load A's and B's k tile into it by
    TMA. ``ring``: the workgroup's k tiles before this output tile's; ``k_first``: its split's first k tile
    (i32)."""
    map_a, map_b = global_ptr(b, maps, 0), global_ptr(b, maps, 128)
    with for_(arith.constant(b.index, 0), arith.constant(b.index, ktiles), arith.constant(b.index, 1)) as loop:
        kt = loop.iv
        slot = pipe.acquire(arith.addi(ring, kt))
        a, bb = slot.a, slot.b
        full_p = pipe.commit(slot)
        k0 = arith.muli(arith.addi(arith.index_cast(b.i32, kt), k_first), b.c(t.bk))
        cluster = ir.Type.parse("!llvm.ptr<7>")
        dst_a = llvm.addrspacecast(cluster, b.ptr(a, 3))
        nvvm.cp_async_bulk_tensor_shared_cluster_global(dst_a, map_a, [k0, m0], full_p, [])
        if rank is None:
            dst_b = llvm.addrspacecast(cluster, b.ptr(bb, 3))
            nvvm.cp_async_bulk_tensor_shared_cluster_global(dst_b, map_b, [k0, n0], full_p, [])
        else:  # this workgroup's half of B, into both workgroups of the pair (same offsets, same barrier)
            half = t.bn // 2
            dst_b = llvm.addrspacecast(cluster, b.ptr(arith.addi(bb, arith.muli(rank, b.c(half * SWIZZLE_BYTES))), 3))
            row = arith.addi(n0, arith.muli(rank, b.c(half)))
            both = arith.constant(ir.IntegerType.get_signless(16), 3)
            nvvm.cp_async_bulk_tensor_shared_cluster_global(dst_b, map_b, [k0, row], full_p, [], multicast_mask=both)


def _wgmma(b: Ints, t: Sm90Tiling, acc: ir.Value, a: ir.Value, bb: ir.Value, a_rows: ir.Value,
           elem: tuple[str, str], fresh: bool = False) -> ir.Value:  # fmt: skip
    """The consumer's k tile: four wgmma m64n{bn}k16 (k32 for 8-bit types) on descriptors of its 64 rows of
    A and of B, each step 32 bytes further along the swizzled rows (``elem``: A's and B's wgmma types;
    ``fresh``: the first one ignores ``acc``, scale-d 0)."""
    bits = b.c(descriptor(0), b.i64)  # the fields other than the start address

    def desc(addr: ir.Value) -> ir.Value:
        return arith.ori(arith.shrui(arith.extui(b.i64, addr), b.c(4, b.i64)), bits)

    da = desc(arith.addi(a, a_rows))
    db = desc(bb)
    attr = ir.Attribute.parse
    wk = STEP_BYTES // t.elem_bytes
    for k in range(SWIZZLE_BYTES // STEP_BYTES):
        step = b.c(k * STEP_BYTES // 16, b.i64)  # 32 bytes, in the descriptor's 16-byte units
        acc = nvvm.wgmma_mma_async(
            acc_type(t), acc, arith.addi(da, step), arith.addi(db, step),
            attr(f"#nvvm.shape<m = 64, n = {t.bn}, k = {wk}>"), attr(f"#nvvm.wgmma_type<{elem[0]}>"),
            attr(f"#nvvm.wgmma_type<{elem[1]}>"), attr("#nvvm.wgmma_type<f32>"),
            attr(f"#nvvm.wgmma_scale_out<{'zero' if fresh and k == 0 else 'one'}>"),
            attr("#nvvm.wgmma_scale_in<one>"), attr("#nvvm.wgmma_scale_in<one>"),
            attr("#nvvm.mma_layout<row>"), attr("#nvvm.mma_layout<col>"),
        )  # fmt: skip
    return acc


def _consumer(b: Ints, t: Sm90Tiling, pipe: Pipeline, a_rows: ir.Value, ktiles: int, elem: tuple[str, str],
              ring: ir.Value) -> ir.Value:  # fmt: skip
    """Warpgroup loop over k tiles with one wgmma group in flight (``a_rows``: byte offset of its 64 rows
    in an A tile; ``ring`` as :func:`_producer`'s); returns the accumulators once all its wgmmas are done
    and its last stage released. ``promote``: each k tile's group waited for, its partial added into the
    f32 accumulators (carried beside it)."""
    bounds = arith.constant(b.index, 0), arith.constant(b.index, ktiles), arith.constant(b.index, 1)
    with for_(*bounds, [zero_acc(b, t)] * (2 if t.promote else 1)) as loop:
        kt = loop.iv
        slot = pipe.wait(arith.addi(ring, kt))
        nvvm.wgmma_fence_aligned()
        acc = _wgmma(b, t, loop.args[-1], slot.a, slot.b, a_rows, elem, fresh=t.promote)
        nvvm.wgmma_commit_group_sync_aligned()
        if t.promote:  # this k tile's partial, once done, into the f32 accumulators; its stage released
            nvvm.wgmma_wait_group_sync_aligned(0)
            pipe.release(arith.addi(ring, kt))
            loop.yield_(_add_acc(t, loop.args[0], acc), acc)
        else:  # one group in flight: release the previous k tile's stage
            nvvm.wgmma_wait_group_sync_aligned(1)  # k tile kt - 1's group is done: its slot can be refilled
            k32 = arith.index_cast(b.i32, kt)
            with if_(arith.cmpi(arith.CmpIPredicate.ugt, k32, b.c(0))):
                pipe.release(arith.subi(arith.addi(ring, kt), arith.constant(b.index, 1)))
            loop.yield_(acc)
    if t.promote:
        return loop.results[0]
    nvvm.wgmma_wait_group_sync_aligned(0)
    pipe.release(arith.addi(ring, arith.constant(b.index, ktiles - 1)))
    return loop.results[0]


def _add_acc(t: Sm90Tiling, total: ir.Value, part: ir.Value) -> ir.Value:
    """``total + part``, value by value (f32 adds on the CUDA cores: full f32 accumulation)."""
    f32 = ir.F32Type.get()
    for v in range(t.bn // 2):
        pos = ir.DenseI64ArrayAttr.get([v])
        value = arith.addf(llvm.extractvalue(f32, total, pos), llvm.extractvalue(f32, part, pos))
        total = llvm.insertvalue(total, value, pos)
    return total


def _epilogue(b: Ints, t: Sm90Tiling, c: ir.Value, acc: ir.Value, wtid: ir.Value, row0: ir.Value, n0: ir.Value,
              scale: ir.Value | None = None) -> None:  # fmt: skip
    """Each accumulator pair (columns 2 (lane % 4), +1 of an n8 chunk) to C, times ``scale`` (an f32, fp8's
    ``scale_a * scale_b``) if given, converted to C's type; a 3-D C (partials) takes it in split z's slice."""
    lead = [gpu.block_id(gpu.Dimension.z)] if ir.MemRefType(c.type).rank == 3 else []
    out = ir.MemRefType(c.type).element_type
    f32 = ir.F32Type.get()
    idx = b.index
    warp, lane = arith.divui(wtid, arith.constant(idx, 32)), arith.remui(wtid, arith.constant(idx, 32))
    row = arith.addi(
        row0, arith.addi(arith.muli(warp, arith.constant(idx, 16)), arith.divui(lane, arith.constant(idx, 4)))
    )
    col = arith.addi(n0, arith.muli(arith.remui(lane, arith.constant(idx, 4)), arith.constant(idx, 2)))
    for v in range(0, t.bn // 2, 2):
        pair = [llvm.extractvalue(f32, acc, ir.DenseI64ArrayAttr.get([v + e])) for e in range(2)]
        vec = vector.from_elements(ir.VectorType.get([2], f32), pair)
        if scale is not None:
            vec = arith.mulf(vec, vector.broadcast(ir.VectorType.get([2], f32), scale))
        if out != f32:
            vec = arith.truncf(ir.VectorType.get([2], out), vec)
        r = arith.addi(row, arith.constant(idx, 8 * ((v % 4) // 2)))
        cc = arith.addi(col, arith.constant(idx, 8 * (v // 4)))
        if t.splits == 1 or lead:
            vector.store(vec, c, [*lead, r, cc])
            continue
        for e in range(2):  # split-K: this split's partial added to C
            value = vector.extract(vec, [], [e])
            memref.atomic_rmw(arith.AtomicRMWKind.addf, value, c, [r, arith.addi(cc, arith.constant(idx, e))])


def build_gemm_body(entry: ir.Block, bindings: list[ir.Value], k: int, t: Sm90Tiling,
                    scale: float | None = None) -> None:  # fmt: skip
    """Emit the kernel into ``entry`` given its bound memrefs (A, B, maps[, scales], C) for
    :func:`gemm_entry`'s grid; ``scale``: a constant the accumulators are multiplied by (where no scales
    binding is bound).

    Raises:
        ValueError: a size the kernel does not take (M, N, K multiples of the tile), input types it does not
            take (f16, bf16; A and B e4m3 / e5m2) or a tiling for another element size.
    """
    a_mem, b_mem, maps, *scales, c = bindings
    *lead, m, n = ir.MemRefType(c.type).shape
    if lead and (lead != [t.splits] or str(ir.MemRefType(c.type).element_type) != "f32"):
        raise ValueError(f"c: {ir.MemRefType(c.type)}: partials are [splits, M, N] f32 ({t.splits} splits)")
    types = [str(ir.MemRefType(x.type).element_type) for x in (a_mem, b_mem)]
    fp8 = types[0] in FP8_TYPES
    if types[0] not in WGMMA_TYPES or (types[1] not in FP8_TYPES if fp8 else types[1] != types[0]):
        raise ValueError(f"dtype: {'/'.join(types)!r}: the sm_90a GEMM takes f16, bf16, or e4m3/e5m2 A and B")
    if t.elem_bytes != (1 if fp8 else 2):
        raise ValueError(f"elem_bytes: {t.elem_bytes} for {types[0]} inputs")
    out_type = str(ir.MemRefType(c.type).element_type)
    if fp8 and out_type not in ("f32", "bf16"):
        raise ValueError(f"out: {out_type!r}: the fp8 GEMM writes f32 or bf16")
    if t.splits > 1 and out_type != "f32":
        raise ValueError(f"out: {out_type!r}: split-K adds f32 partials")
    elem = (WGMMA_TYPES[types[0]], WGMMA_TYPES[types[1]])
    for name, size, tile in (("m", m, t.bm), ("n", n, t.bn), ("k", k, t.bk)):
        if size % tile:
            raise ValueError(f"{name}: {size} is not a multiple of the tile's {tile}")
    b = Ints()
    idx = b.index
    if t.cluster > 1:  # IREE carries it to PTX: .explicitcluster .reqnctapercluster 2, 1, 1
        entry.owner.attributes["nvvm.cluster_dim"] = ir.DenseI32ArrayAttr.get([t.cluster, 1, 1])
    tid = gpu.thread_id(gpu.Dimension.x)
    wg = arith.divui(tid, arith.constant(idx, WARPGROUP))
    pipe = Pipeline(b, t, shared_base(b, t))
    pipe.init(tid)
    rank = nvvm.read_ptx_sreg_cluster_ctarank() if t.cluster > 1 else None
    if (k // t.bk) % t.splits:
        raise ValueError(f"splits: {t.splits} does not divide the {k // t.bk} k tiles")
    ktiles = k // t.bk // t.splits
    k_first = arith.muli(arith.index_cast(b.i32, gpu.block_id(gpu.Dimension.z)), b.c(ktiles))
    # setmaxnreg acts only where each warpgroup's role is one branch of a single if/else (HOPPER.md)
    with if_(arith.cmpi(arith.CmpIPredicate.eq, wg, arith.constant(idx, 0)), else_=True) as role:
        if t.producer_regs:
            nvvm.setmaxregister(t.producer_regs, ir.Attribute.parse("#nvvm.action<decrease>"))
        with if_(arith.cmpi(arith.CmpIPredicate.eq, tid, arith.constant(idx, 0))):
            for m0, n0, ring in _tiles(b, t, m, n, ktiles, rank):
                m32, n32 = arith.index_cast(b.i32, m0), arith.index_cast(b.i32, n0)
                _producer(b, t, pipe, maps, m32, n32, ktiles, ring, rank, k_first)
    with role.otherwise():
        if t.consumer_regs:
            nvvm.setmaxregister(t.consumer_regs, ir.Attribute.parse("#nvvm.action<increase>"))
        consumer = arith.subi(wg, arith.constant(idx, 1))
        wtid = arith.remui(tid, arith.constant(idx, WARPGROUP))
        a_rows = arith.index_cast(b.i32, arith.muli(consumer, arith.constant(idx, WGMMA_M * SWIZZLE_BYTES)))
        factor = None
        if scales:  # fp8's per-tensor scales, read once: out = scale_a * scale_b * acc
            s_a, s_b = (memref.load(scales[0], [arith.constant(idx, i)]) for i in (0, 1))
            factor = arith.mulf(s_a, s_b)
        elif scale is not None and scale != 1.0:  # the product's: the problem's epilogue alpha
            factor = arith.constant(ir.F32Type.get(), scale)
        for m0, n0, ring in _tiles(b, t, m, n, ktiles, rank):
            acc = _consumer(b, t, pipe, a_rows, ktiles, elem, ring)
            row0 = arith.addi(m0, arith.muli(consumer, arith.constant(idx, WGMMA_M)))
            _epilogue(b, t, c, acc, wtid, row0, n0, factor)
    pipe.close()


def _tiles(b: Ints, t: Sm90Tiling, m: int, n: int, ktiles: int, rank: ir.Value | None):
    """The workgroup's output tiles, as (first row, first column, k tiles of the ring before it): its block
    ids, or (persistent) a loop over tiles ``id, id + persistent, ...``, N fastest (one iteration yielded
    inside the ``scf.for``). In a cluster the pair walks pair tiles (M tiles ``2i, 2i + 1`` of one N tile)
    the same way, and ``rank`` picks the M tile."""
    idx = b.index

    def c(v: int) -> ir.Value:
        return arith.constant(idx, v)

    pair = t.cluster
    mine = c(0) if rank is None else arith.index_cast(idx, rank)
    if not t.persistent:
        m_tile = arith.addi(arith.muli(gpu.block_id(gpu.Dimension.y), c(pair)), mine)
        n0 = arith.muli(arith.divui(gpu.block_id(gpu.Dimension.x), c(pair)), c(t.bn))
        yield arith.muli(m_tile, c(t.bm)), n0, c(0)
        return
    first = arith.divui(gpu.block_id(gpu.Dimension.x), c(pair))
    total, n_tiles = (m // t.bm // pair) * (n // t.bn), n // t.bn
    with for_(first, c(total), c(t.persistent // pair)) as loop:
        tile = loop.iv
        done = arith.divui(arith.subi(tile, first), c(t.persistent // pair))
        m_tile = arith.addi(arith.muli(arith.divui(tile, c(n_tiles)), c(pair)), mine)
        n0 = arith.muli(arith.remui(tile, c(n_tiles)), c(t.bn))
        yield arith.muli(m_tile, c(t.bm)), n0, arith.muli(done, c(ktiles))


def gemm_module(m: int, n: int, k: int, t: Sm90Tiling, dtype: str = "f16", out: str = "f32",
                dtype_b: str | None = None) -> ir.Module:  # fmt: skip
    """``@main(A: MxK, B: NxK, maps: 256 x i8[, scales: 2 x f32]) -> C: MxN`` dispatching the kernel (in the
    current context); ``dtype_b``: B's type where it differs (fp8: e4m3 A, e5m2 B)."""
    from iree.compiler.dialects import func

    from convbw_mlir.kernels.entry import build_dispatch

    elem, out_t = ir.Type.parse(dtype), ir.Type.parse(out)
    entry = gemm_entry(m, n, k, t, elem, out_t, ir.Type.parse(dtype_b) if dtype_b else None)
    module = ir.Module.create()
    tensors = [ir.RankedTensorType.get(ir.MemRefType(x).shape, ir.MemRefType(x).element_type) for x in entry.bindings]
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("main", ir.FunctionType.get(tensors[:-1], [tensors[-1]]))
        block = fn.add_entry_block()
    with ir.InsertionPoint(block):
        result = build_dispatch(
            entry, lambda blk, mems: build_gemm_body(blk, mems, k, t), list(block.arguments), tensors[-1],
            ir.InsertionPoint.at_block_begin(module.body),
        )  # fmt: skip
        func.ReturnOp([result])
    return module
