"""A numpy emulator of the AMD explicit kernel's IR (no AMD GPU here): every lane of a workgroup at once.

It runs the ops ``convbw_mlir.kernels.gemm_cdna`` / ``gemm_rdna`` emit (the arith/scf/gpu/vector
interpreter of ``sm80_emulator`` plus LDS, ``amdgpu.mfma``, ``amdgpu.wmma`` and
``amdgpu.raw_buffer_load``), one value an array over the workgroup's lanes, in waves of 64 (CDNA) or
32 (RDNA) lanes, and checks what the hardware would not forgive:

- **Lane maps** (:data:`LANE_MAPS`): which matrix entry each lane's vector element holds, for A, B and
  C/D of every MFMA/WMMA form the target table names: formulas written here, checked equal to the
  tables AMD's matrix instruction calculator prints (tests/data/amd_lane_maps,
  tests/test_amd_emulator.py); nothing is taken from the kernel's own ``MatrixForm``. A vector element
  ``e`` of a 16-bit type sits in register ``e // 2``, bits ``[15:0]`` for even ``e`` and ``[31:16]``
  for odd (LLVM's packing of ``<N x half>`` in VGPRs); a 32-bit element ``e`` is register ``e``. An
  entry several lanes hold (RDNA 3 repeats A and B in both half-waves) must be equal in all of them.
- **Bounds**: every global or LDS access in bounds for the lanes that make it (numpy would wrap a
  negative index silently); a vector access may not run past its row. ``raw_buffer_load`` returns 0
  past ``num_records`` (the memref's bytes) instead, as AMD buffer loads do (checked an element at a
  time; the kernel emits none today: it clamps every address).
- **LDS races** (:class:`LdsRace`): waves run in no fixed order between barriers, so within one barrier
  interval a wave may not read an LDS element another wave wrote, nor write one another wave read or
  wrote. ``gpu.barrier`` and ``amdgpu.lds_barrier`` end the interval.
- **Types**: LDS and global arrays hold the IR's element type (f16, or bf16 as ml_dtypes'), registers
  f32 holding those values exactly; ``arith.truncf`` rounds to nearest even in its result type.
- **Stores**: each element of the output written exactly once (:func:`run_kernel` returns the counts).
- **Counts** (:class:`Counts`, for bench/amd_estimate.py): matrix instructions, global and LDS bytes,
  and LDS cycles with bank conflicts, counted from the emulated accesses (the model: :meth:`Counts.lds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sm80_emulator import _Block, _Group  # the generic arith/scf/gpu/vector interpreter (not edited here)

from convbw_mlir.ir_imports import ir

__all__ = ["LANE_MAPS", "Counts", "Emulated", "LaneMap", "LdsRace", "emulate", "lane_map", "run_kernel"]


@dataclass
class Counts:
    """What the emulated workgroups did, as the hardware would count it: an instruction once a wave that
    has an active lane, bytes for the active lanes only.

    LDS bank conflicts, the model: ``banks`` banks of 4 bytes (IREE's target description, KnownTargets.cpp
    ``workgroupMemoryBankCount``: 32 on CDNA 3, 64 on RDNA 3), one dword a bank a clock; a wave's access
    is served in groups of consecutive lanes of ``4 * banks`` bytes (CDNA 3: 8 lanes for 16 bytes a lane,
    32 for 4 or fewer); a group takes as many clocks as the most distinct dwords one bank must deliver
    (lanes reading the same dword share it: a broadcast). ``lds_cycles`` against ``lds_ideal_cycles`` (one
    clock a group) is the conflict cost."""

    banks: int = 32
    mma: int = 0
    global_load_bytes: int = 0
    global_store_bytes: int = 0
    lds_read_bytes: int = 0
    lds_write_bytes: int = 0
    lds_instructions: int = 0
    lds_cycles: int = 0
    lds_ideal_cycles: int = 0

    def lds(self, lanes: np.ndarray, byte_addr: np.ndarray, width: int) -> None:
        """Count one wave's LDS access: the active ``lanes`` (indices in the wave) at ``byte_addr``, ``width``
        bytes each."""
        self.lds_instructions += 1
        group = lanes // max(1, 4 * self.banks // max(width, 4))
        dwords = byte_addr[:, None] // 4 + np.arange(-(-width // 4))[None, :]  # the dwords each lane touches
        for g in np.unique(group):
            touched = np.unique(dwords[group == g])
            self.lds_cycles += int(np.bincount(touched % self.banks).max())
            self.lds_ideal_cycles += 1

    def add(self, other: Counts) -> None:
        for name in self.__dataclass_fields__:
            if name != "banks":
                setattr(self, name, getattr(self, name) + getattr(other, name))


class LdsRace(AssertionError):
    """Two waves touch one LDS element in one barrier interval, at least one of them writing."""


@dataclass(frozen=True)
class LaneMap:
    """Where the lanes of one wave hold an instruction's matrices: arrays ``[lane, element, 2]``.

    ``a[l, e]`` is ``(i, k)`` of A[i][k], ``b[l, e]`` is ``(k, j)`` of B[k][j], ``d[l, e]`` is ``(i, j)`` of
    C and D (the same registers). A 16-bit result on RDNA 3 puts ``d[l, e]`` in element
    ``2e + subwordOffset`` of a ``vector<16xf16>`` (OPSEL's half; the other half keeps C's); on RDNA 4
    it is ``d`` packed two a register.
    """

    name: str
    m: int
    n: int
    k: int
    wave: int
    a: np.ndarray
    b: np.ndarray
    d: np.ndarray


def _dtype(t: ir.Type) -> np.dtype:
    """The numpy type of an MLIR element type (bf16: ml_dtypes', as the runtime's arrays)."""
    from convbw_mlir.problem import numpy_dtype

    return numpy_dtype(str(t))


def _element(t: ir.Type) -> ir.Type:
    return ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t


def _grid(wave: int, per: int, f) -> np.ndarray:
    return np.array([[f(lane, e) for e in range(per)] for lane in range(wave)], np.int64)


def _mfma(name: str, m: int, k: int, per: int) -> LaneMap:
    """CDNA MFMA, one block, wave64: lane l holds row (column) l % m of A (B), k ``per(l / m) .. +per-1``;
    D in groups of 4 rows: element e of lane l is row ``8(e / 4) + 4(l / m) + e % 4`` (32 rows) or
    ``4(l / 16) + e`` (16 rows), column l % m (the CDNA 2/3 tables of AMD's calculator)."""
    groups = 64 // m

    def d(lane, e):
        return (8 * (e // 4) + 4 * (lane // m) + e % 4 if m == 32 else 4 * (lane // 16) + e, lane % m)

    acc = m * m // 64
    assert groups * per == k
    return LaneMap(name, m, m, k, 64, _grid(64, per, lambda ln, e: (ln % m, per * (ln // m) + e)),
                   _grid(64, per, lambda ln, e: (per * (ln // m) + e, ln % m)), _grid(64, acc, d))  # fmt: skip


def _rdna4_k(lane: int, e: int) -> int:
    # RDNA 4 (gfx12) WMMA: lanes 0-15 hold k 0-3 and 8-11, lanes 16-31 k 4-7 and 12-15 (AMD's calculator)
    return 4 * (lane // 16) + e % 4 + 8 * (e // 4)


LANE_MAPS: dict[str, LaneMap] = {
    m.name: m
    for m in (
        _mfma("mfma_16x16x16", 16, 16, 4),  # v_mfma_f32_16x16x16_f16/_bf16 (gfx942), ...16f16/bf16_1k (gfx90a)
        _mfma("mfma_32x32x8", 32, 8, 4),
        # gfx950 (CDNA 4), twice the k a lane: not in AMD's calculator (1.3.2) and no AMD table of them
        # was found, so these two are the CDNA 3 pattern extended, unchecked (the kernel does not use them)
        _mfma("mfma_16x16x32", 16, 32, 8),
        _mfma("mfma_32x32x16", 32, 16, 8),
        LaneMap("wmma_rdna3", 16, 16, 16, 32, _grid(32, 16, lambda ln, e: (ln % 16, e)),
                _grid(32, 16, lambda ln, e: (e, ln % 16)), _grid(32, 8, lambda ln, e: (2 * e + ln // 16, ln % 16))),
        LaneMap("wmma_rdna4", 16, 16, 16, 32, _grid(32, 8, lambda ln, e: (ln % 16, _rdna4_k(ln, e))),
                _grid(32, 8, lambda ln, e: (_rdna4_k(ln, e), ln % 16)),
                _grid(32, 8, lambda ln, e: (8 * (ln // 16) + e, ln % 16))),
    )
}  # fmt: skip


def lane_map(op_name: str, m: int, n: int, k: int, a_elems: int) -> LaneMap:
    """The map of an ``amdgpu.mfma``/``amdgpu.wmma`` of shape ``m x n x k`` with ``a_elems`` of A a lane."""
    if op_name == "amdgpu.wmma" and (m, n, k) == (16, 16, 16):
        return LANE_MAPS["wmma_rdna3" if a_elems == 16 else "wmma_rdna4"]
    found = LANE_MAPS.get(f"mfma_{m}x{n}x{k}")
    if op_name != "amdgpu.mfma" or found is None or found.a.shape[1] != a_elems:
        raise NotImplementedError(f"emulator: {op_name} {m}x{n}x{k} with {a_elems} elements of A a lane")
    return found


class _Lds:
    """One LDS allocation's race bookkeeping for the current barrier interval."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        size = int(np.prod(shape))
        self.shape = shape
        self.writer = np.full(size, -1, np.int64)  # the wave that wrote it this interval, -1 none
        self.readers = np.zeros(size, np.uint64)  # bit w: wave w read it this interval

    def reset(self) -> None:
        self.writer[:] = -1
        self.readers[:] = 0

    def access(self, wave: int, flat: np.ndarray, write: bool) -> None:
        flat = flat.ravel()
        other = (self.writer[flat] >= 0) & (self.writer[flat] != wave)
        bit = np.uint64(1) << np.uint64(wave)
        if write:
            other |= (self.readers[flat] & ~bit) != 0
        if other.any():
            at = np.unravel_index(int(flat[np.argmax(other)]), self.shape)
            w = int(self.writer[flat[np.argmax(other)]])
            what = f"wave {w} wrote" if w >= 0 and w != wave else "another wave read"
            verb = "writes" if write else "reads"
            raise LdsRace(f"wave {wave} {verb} LDS element {tuple(int(i) for i in at)} that {what} since the "
                          "last barrier")  # fmt: skip
        if write:
            self.writer[flat] = wave
        else:
            np.bitwise_or.at(self.readers, flat, bit)


class _AmdBlock(_Block):
    """A workgroup of ``threads`` lanes in waves of ``wave``: sm80_emulator's interpreter plus AMD's ops."""

    def __init__(self, threads: int, wave: int, block_id: tuple[int, int, int], bindings: dict[int, np.ndarray],
                 writes: dict[int, np.ndarray], counts: Counts | None = None) -> None:  # fmt: skip
        super().__init__(threads, block_id, bindings)
        self.counts = counts
        self.wave = wave
        self.lanes_wave = self.tid // wave
        self.lds: dict[int, _Lds] = {}  # id(array) -> its bookkeeping
        self.writes = writes  # id(binding array) -> store counts per element

    def step(self, op: ir.Operation, group: _Group):  # noqa: C901 - one branch an op
        name = op.name
        ins, res = list(op.operands), list(op.results)
        mask = np.ones(self.t, bool) if group.mask is None else group.mask
        if name == "memref.alloc":
            mt = ir.MemRefType(res[0].type)
            mem = np.full(mt.shape, np.nan, _dtype(mt.element_type))  # uninitialised: NaN shows a stray read
            self.env[res[0]] = mem
            if "workgroup" in str(mt.memory_space):
                self.lds[id(mem)] = _Lds(tuple(mt.shape))
            return None
        if name in ("gpu.barrier", "amdgpu.lds_barrier"):
            for lds in self.lds.values():
                lds.reset()
            yield ("sync", 0, self.t, int(mask.sum()))
            return None
        if name in ("memref.load", "vector.load"):
            n = ir.VectorType(res[0].type).shape[0] if name == "vector.load" else 0
            self.env[res[0]] = self._load(ins[0], ins[1:], n, mask)
            return None
        if name in ("memref.store", "vector.store"):
            n = ir.VectorType(ins[0].type).shape[0] if name == "vector.store" else 0
            self._store_to(ins[1], ins[2:], np.asarray(self.get(ins[0])), n, mask)
            return None
        if name == "arith.truncf":  # to f16 or bf16, rounded to nearest even, held in f32 registers
            to = _dtype(_element(res[0].type))
            self.env[res[0]] = np.asarray(self.get(ins[0]), np.float32).astype(to).astype(np.float32)
            return None
        if name == "amdgpu.raw_buffer_load":
            self.env[res[0]] = self._buffer_load(op, ins, res, mask)
            return None
        if name in ("amdgpu.mfma", "amdgpu.wmma"):
            self.env[res[0]] = self._matrix(op, name, ins)
            if self.counts is not None:
                self.counts.mma += len(np.unique(self.lanes_wave[mask]))
            return None
        return (yield from super().step(op, group))

    def _where(self, mem_v: ir.Value, idx_v: list[ir.Value], n: int, mask: np.ndarray, what: str):
        """(array, index tuple for the active lanes [, element offsets]) after checking bounds."""
        mem = self.get(mem_v)
        idx = [self.idx(v)[mask] for v in idx_v]
        width = max(n, 1)
        for d, (i, size) in enumerate(zip(idx, mem.shape)):
            hi = size - (width - 1 if d == len(idx) - 1 else 0)
            bad = (i < 0) | (i >= hi)
            if bad.any():
                lane = int(np.flatnonzero(mask)[np.argmax(bad)])
                at = tuple(int(j[np.argmax(bad)]) for j in idx)
                raise AssertionError(f"{what} out of bounds: lane {lane} at {at} (+{width}) of {mem.shape}")
        return mem, idx

    def _flat(self, mem: np.ndarray, idx: list[np.ndarray], n: int) -> np.ndarray:
        flat = np.ravel_multi_index(tuple(idx), mem.shape)
        return flat[:, None] + np.arange(max(n, 1)) if n else flat[:, None]

    def _load(self, mem_v, idx_v, n, mask):
        mem, idx = self._where(mem_v, idx_v, n, mask, "load")
        flat = self._flat(mem, idx, n)
        lds = self.lds.get(id(mem))
        if lds is not None:
            waves = self.lanes_wave[mask]
            for w in np.unique(waves):
                lds.access(int(w), flat[waves == w], write=False)
        self._count(mem_v, mem, flat, mask, write=False)
        vals = mem.reshape(-1)[flat]  # [active lanes, n or 1]
        out = np.zeros((self.t, max(n, 1)), np.float32)
        out[mask] = vals
        return out if n else out[:, 0]

    def _store_to(self, mem_v, idx_v, val, n, mask):
        mem, idx = self._where(mem_v, idx_v, n, mask, "store")
        flat = self._flat(mem, idx, n)
        val = np.broadcast_to(val, (self.t, n) if n else (self.t,))[mask].reshape(flat.shape)
        lds = self.lds.get(id(mem))
        if lds is not None:
            waves = self.lanes_wave[mask]
            for w in np.unique(waves):
                lds.access(int(w), flat[waves == w], write=True)
        mem.reshape(-1)[flat] = val
        self._count(mem_v, mem, flat, mask, write=True)
        count = self.writes.get(id(mem))
        if count is not None:
            np.add.at(count, flat.ravel(), 1)

    def _count(self, mem_v: ir.Value, mem: np.ndarray, flat: np.ndarray, mask: np.ndarray, write: bool) -> None:
        """Add one access of the active lanes (``flat``: their element indices) to :attr:`counts`."""
        c = self.counts
        if c is None:
            return
        elem = ir.MemRefType(mem_v.type).element_type
        size = (elem.width if hasattr(elem, "width") else ir.FloatType(elem).width) // 8
        nbytes = int(flat.size) * size
        if id(mem) not in self.lds:
            if write:
                c.global_store_bytes += nbytes
            else:
                c.global_load_bytes += nbytes
            return
        if write:
            c.lds_write_bytes += nbytes
        else:
            c.lds_read_bytes += nbytes
        waves, lanes = self.lanes_wave[mask], np.flatnonzero(mask) % self.wave
        for w in np.unique(waves):
            c.lds(lanes[waves == w], flat[waves == w][:, 0] * size, flat.shape[1] * size)

    def _buffer_load(self, op, ins, res, mask):
        """``amdgpu.raw_buffer_load``: 0 where an element's byte offset is at or past ``num_records``."""
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        mem = self.get(ins[0])
        idx = [self.idx(v) for v in ins[1 : 1 + seg[1]]]
        sgpr = int(self.get(ins[1 + seg[1]])) if seg[2] else 0
        offset = ir.IntegerAttr(op.attributes["indexOffset"]).value if "indexOffset" in op.attributes else 0
        checked = "boundsCheck" not in op.attributes or ir.BoolAttr(op.attributes["boundsCheck"]).value
        rt = res[0].type
        n = ir.VectorType(rt).shape[0] if isinstance(rt, ir.VectorType) else 0
        strides = np.cumprod((1, *mem.shape[::-1]))[:-1][::-1]  # the identity layout's strides
        lin = sum(i * s for i, s in zip(idx, strides)) + offset + sgpr
        elems = lin[:, None] + np.arange(max(n, 1))
        inside = (elems >= 0) & (elems < mem.size)
        if not checked and (mask[:, None] & ~inside).any():
            raise AssertionError("raw_buffer_load without bounds checking reads past its buffer")
        vals = np.where(inside, mem.reshape(-1)[np.clip(elems, 0, mem.size - 1)], 0).astype(np.float32)
        vals[~mask] = 0
        return vals if n else vals[:, 0]

    def _matrix(self, op, name, ins):
        """One ``amdgpu.mfma``/``amdgpu.wmma`` per wave: D = A B + C with the lane maps of AMD's ISA."""
        attr = {k: ir.IntegerAttr(op.attributes[k]).value for k in ("m", "n", "k")}
        for k in ("blocks", "cbsz", "abid"):
            if k in op.attributes and ir.IntegerAttr(op.attributes[k]).value not in (0, 1 if k == "blocks" else 0):
                raise NotImplementedError(f"emulator: {name} with {k} = {op.attributes[k]}")
        if "blgp" in op.attributes and "none" not in str(op.attributes["blgp"]):
            raise NotImplementedError(f"emulator: {name} with blgp {op.attributes['blgp']}")
        a, b, c = (np.asarray(self.get(v), np.float64) for v in ins)
        lm = lane_map(name, attr["m"], attr["n"], attr["k"], a.shape[1])
        if lm.wave != self.wave:
            raise AssertionError(f"{name} {lm.name} needs waves of {lm.wave} lanes, the kernel has {self.wave}")
        waves = self.t // self.wave
        A = self._gather(a, lm.a, (lm.m, lm.k), waves, "A")
        B = self._gather(b, lm.b, (lm.k, lm.n), waves, "B")
        out_t = ir.VectorType(op.results[0].type)
        f16_out = str(out_t.element_type) != "f32"
        d_map, sel = lm.d, None
        if f16_out and lm.name == "wmma_rdna3":  # 16 f16 a lane: the result in every other element
            sub = ir.IntegerAttr(op.attributes["subwordOffset"]).value if "subwordOffset" in op.attributes else 0
            sel = 2 * np.arange(8) + sub
        cs = c if sel is None else c[:, sel]
        C = self._gather(cs, d_map, (lm.m, lm.n), waves, "C")
        D = (A @ B + C).astype(np.float16 if f16_out else np.float32)
        lanes = D[:, d_map[..., 0], d_map[..., 1]].reshape(self.t, -1)
        if sel is None:
            return lanes.astype(np.float32)
        out = c.astype(np.float32).copy()  # the other halves keep C's (the instruction writes one half)
        out[:, sel] = lanes
        return out

    def _gather(self, v: np.ndarray, where: np.ndarray, shape, waves: int, what: str) -> np.ndarray:
        """The ``shape`` matrix each wave's lanes hold in ``v`` ([lanes, elements]) by the map ``where``."""
        mats = np.full((waves, *shape), np.nan)
        per = v.reshape(waves, self.wave, -1)
        mats[:, where[..., 0], where[..., 1]] = per
        back = mats[:, where[..., 0], where[..., 1]]  # entries held by several lanes: all must agree
        same = (back == per) | (np.isnan(back) & np.isnan(per))
        if not same.all():
            w, lane, e = (int(x[0]) for x in np.nonzero(~same))
            held = f"{what}{[int(i) for i in where[lane, e]]}"
            raise AssertionError(f"{what}: lane {lane} of wave {w} element {e} differs from the other lanes holding "
                                 f"{held} (RDNA 3 repeats A and B in both half-waves)")  # fmt: skip
        return mats


def run_kernel(func: ir.Operation, grid: tuple[int, int, int], threads: int, wave: int, bindings: list[np.ndarray],
               blocks: list[tuple[int, int, int]] | None = None,
               counts: Counts | None = None) -> np.ndarray:  # fmt: skip
    """Run ``func`` (the kernel's ``func.func``) over ``grid`` (or only ``blocks`` of it); ``bindings`` in
    binding order, the last written; ``counts`` (where given) adds up what the workgroups did.

    Returns the number of stores to each element of the last binding (1 everywhere for a kernel that
    writes its output once)."""
    body = func.regions[0].blocks[0]
    out = bindings[-1]
    writes = {id(out): np.zeros(out.size, np.int64)}
    if blocks is None:
        blocks = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    for block_id in blocks:
        block = _AmdBlock(threads, wave, block_id, dict(enumerate(bindings)), writes, counts)
        for kind, bid, n, k in block.run(body, _Group(None)):
            assert k == n, f"barrier {bid} ({kind}) reached by {k} of its {n} lanes"
    return writes[id(out)].reshape(out.shape)


@dataclass
class Emulated:
    """One emulated run: the kernel's C as ``[groups, m, n]`` float64 (split-K partials summed; NaN where
    no workgroup ran), the float64 reference in the same view, and the store counts per split."""

    got: np.ndarray
    want: np.ndarray
    counts: np.ndarray
    shape: object  # convbw_mlir.policies.sm80.GemmShape

    def error(self) -> float:
        """Max error of the computed entries relative to the largest reference entry."""
        done = ~np.isnan(self.got)
        return float(np.abs(self.got[done] - self.want[done]).max() / np.abs(self.want).max())


def emulate(
    problem,
    target: str,
    *,
    plan=None,
    corners: bool = False,
    mutate=None,
    seed: int = 3,
    blocks: list[tuple[int, int, int]] | None = None,
    counts: Counts | None = None,
) -> Emulated:
    """Build the AMD kernel of ``problem`` for ``target`` (``plan``: the plan's own by default) and run it.

    ``corners``: only the workgroups of the first and last M and N tiles (every group and split of
    them: their sums are whole), where the ragged edges are. ``mutate(func)`` edits the kernel's
    ``func.func`` before it runs (a seeded bug). ``blocks``: only these workgroups; ``counts``: what they did
    is added there (:class:`Counts`)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel
    from convbw_mlir.passes.framework import collect_ops

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels import gemm_cdna
    from convbw_mlir.plan import decide, explicit_tiling
    from convbw_mlir.policies.sm80 import gemm_shape
    from convbw_mlir.reference import random_inputs, reference

    plan = plan or decide(problem, target, strategy="explicit")
    shape, t = gemm_shape(problem, plan.k_batch), explicit_tiling(plan)
    x, dy = random_inputs(problem, seed=seed)
    grid = gemm_cdna.grid(shape, t)
    if corners:
        xs, ys = sorted({0, grid[0] - 1}), sorted({0, grid[1] - 1})
        blocks = [(bx, by, z) for z in range(grid[2]) for by in ys for bx in xs]
    with new_context():
        module = convbw.build_module(problem, plan)
        ExplicitKernel().run(module.operation)
        (fn,) = [f for f in collect_ops(module.operation, "func.func") if "translation_info" in f.attributes]
        if mutate is not None:
            mutate(fn)
        types = [ir.MemRefType(s.results[0].type) for s in collect_ops(fn, "hal.interface.binding.subspan")]
        out = np.full(types[2].shape, np.nan, _dtype(types[2].element_type))
        stored = run_kernel(fn, grid, t.threads, t.wave, [dy.reshape(types[0].shape), x.reshape(types[1].shape), out],
                            blocks, counts)  # fmt: skip
    view = (shape.groups, shape.m, shape.n)
    got = out.astype(np.float64).reshape((shape.splits, *view) if shape.splits > 1 else view)
    if shape.splits > 1:
        got = got.sum(0)
    want = reference(problem, x, dy).reshape(view)
    return Emulated(got, want, stored, shape)
