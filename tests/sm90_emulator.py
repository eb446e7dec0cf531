"""The sm_80 emulator (sm80_emulator.py) grown by the sm_90a ops of ``convbw_mlir.kernels.gemm_sm90``.

Shared memory is one byte-addressed space (an element's value at its first byte: 16-bit values, or an
8-bit element's code 0..255, which wgmma decodes by its type attribute; NaN until written, at a base that is 16- but
not 1024-aligned, so the kernel's own rounding is exercised); the LLVM pointer casts and struct ops carry
integers and arrays. As the PTX ISA has them:

- ``mbarrier``: a phase bit, pending arrivals and a transaction count; a phase completes when both reach 0
  (then arrivals reset to the init count); ``try_wait.parity P`` passes once the phase of parity ``P``
  completed (a fresh barrier is in phase 0: waiting on parity 1 passes at once), else the thread group
  spins; when every group spins or waits with nothing left to run, that is a ``Deadlock``;
- TMA (``cp.async.bulk.tensor.2d``): the box lands at issue with the 128-byte swizzle (16-byte chunk
  ``j`` of the 128-byte row ``r`` of a 1024-aligned tile goes to chunk ``j ^ (r % 8)``: address bits 4-6
  XOR bits 7-9) and completes its bytes on the mbarrier; the tensor map is this module's own encoding
  (:func:`tensor_map`: which binding, its extents, the box), since a CUtensorMap is opaque;
- TMA im2col (``cp.async.bulk.tensor.{3,4,5}d ... .im2col``: 1-, 2-, 3-D convolutions): ``pixels`` positions
  walked through each image's bounding box at the traversal strides, innermost dim first, each read at its
  position plus the load's im2col offsets, zero outside; the corners and offsets held to the PTX ISA's widths
  by the tensor's rank (:func:`im2col_map`); either load's innermost coordinate a multiple of 16 bytes (an H100
  stops on others with cudaErrorIllegalInstruction: the thin90 fuzz, triton-lang/triton#7385; the PTX ISA is silent);
- ``wgmma.mma_async`` m64nNk16 (16-bit) or m64nNk32 (e4m3 / e5m2, K-major only: the PTX ISA gives
  8-bit types no transpose): A and B read through their matrix descriptors (start address, stride byte
  offset between 8-row groups, 128-byte swizzle; K-major), D = A B^T + C, and the accumulators of each
  warpgroup thread laid out as the PTX ISA's figure for the m64nNk16 D fragment has them (:func:`d_fragment`);
  asynchronous: shared memory is read when ``wgmma.wait_group`` retires the wgmma's commit group (the
  latest the PTX ISA allows), and reading the accumulators before that fails;
- roles: the producer and the consumers fork at the kernel's role ``scf.if`` and run interleaved, each
  until it blocks on an mbarrier or a barrier; the producer runs first, so a missing *empty* wait lets it
  overwrite a stage still unread (a wrong result) and a missing *full* wait reads NaN.
- races (:class:`Race`): the threads of a role run in step here, so a missing ``bar.sync`` changes no value;
  happens-before is checked instead, order-free: a vector clock a thread over every workgroup of the launch.
  ``bar.sync`` (``nvvm.barrier``: per id, its thread count; ``gpu.barrier``: the workgroup) and the cluster
  barrier join the clocks of the threads they meet; ``membar.gl`` (``nvvm.memory.barrier``) is cumulative: it
  releases what its thread knows so far and acquires what its earlier integer atomics read; an mbarrier's
  arrivals release to the wait that sees their phase complete; an integer
  ``atomic_rmw`` (a flag, a counter) publishes its thread's last fence and reads what earlier ones published.
  A plain global load or store (partials, dW) must follow the last other thread's store to that element,
  a store also the last other thread's load; an mbarrier's every use by another thread must follow its
  ``mbarrier.init``. f32 ``atomic_rmw`` adds (split-K) and TMA / wgmma traffic are not checked here (the
  mbarrier phases above order them).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from sm80_emulator import Deadlock, _attr_int, _Block, _Group

from convbw_mlir.ir_imports import ir

FP8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}  # wgmma type: codes

__all__ = ["Deadlock", "Race", "d_fragment", "dw_of_plan", "im2col_map", "run_conv", "run_gemm", "tensor_map"]

SHARED_BASE = 80  # 16-aligned, not 1024-aligned: the kernel must round its tiles up itself
CLUSTER = 1 << 36  # a shared::cluster address (mapa): CLUSTER | rank << 32 | shared address
GLOBAL = 1 << 40  # binding i lives at (i + 1) << 40
MAP_MAGIC = 0x5A90
IM2COL_MAGIC = 0x5A91


def tensor_map(binding: int, rows: int, k: int, box_rows: int, box_k: int = 64, elem_bytes: int = 2) -> np.ndarray:
    """128 bytes standing for a 2-D CUtensorMap of a ``rows x k`` tensor of ``elem_bytes``-byte elements
    bound at ``binding`` (8-bit: the binding holds the codes, uint8)."""
    out = np.zeros(16, np.int64)
    out[:7] = (MAP_MAGIC, binding, rows, k, box_rows, box_k, elem_bytes)
    return out.view(np.uint8)


def im2col_map(binding: int, shape: tuple[int, ...], lower: tuple[int, ...], upper: tuple[int, ...],
               strides: tuple[int, ...], pixels: int = 64, channels: int = 64) -> np.ndarray:  # fmt: skip
    """128 bytes standing for an im2col CUtensorMap of a channels-last 16-bit tensor ``[N, *spatial, C]`` (3-, 4- or
    5-D: a 1-, 2- or 3-D convolution's x) bound at ``binding``: the bounding box corners and traversal strides, one
    a spatial dim innermost first, as cuTensorMapEncodeIm2col takes them."""
    rank = len(shape) - 2
    assert 1 <= rank <= 3 and len(lower) == len(upper) == len(strides) == rank, "an im2col map is 3-, 4- or 5-D"
    out = np.zeros(32, np.int32)  # 19 fields at most: 32-bit ones fit 128 bytes
    fields = (IM2COL_MAGIC, binding, rank, pixels, channels, *shape, *lower, *upper, *strides)
    out[: len(fields)] = fields
    return out.view(np.uint8)


# PTX ISA / cuTensorMapEncodeIm2col: the corners' range by the tensor's rank (3-D 16 bits, 4-D 8, 5-D 5, signed)
CORNER_BITS = {1: 16, 2: 8, 3: 5}


def d_fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) ``[128, n / 2]`` of each accumulator of each warpgroup thread in a m64nNk16 wgmma
    (PTX ISA, "Matrix fragments for wgmma .m64nNk16", figure for D): warp ``w`` owns rows 16w..16w+15;
    lane ``l`` holds, for each n8 chunk ``c``, (row 16w + l/4, columns 8c + 2(l%4) and +1) then the same
    columns 8 rows lower."""
    t = np.arange(128)[:, None]
    v = np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((v // 2) % 2)
    col = 8 * (v // 4) + 2 * (lane % 4) + v % 2
    return np.broadcast_to(row, (128, n // 2)), np.broadcast_to(col, (128, n // 2))


def _swizzle128(address: np.ndarray) -> np.ndarray:
    return address ^ (((address >> 7) & 7) << 4)


class Race(AssertionError):
    """An access no barrier, fence or flag orders after the other thread's conflicting access (or after its
    mbarrier's init)."""


class _Clocks:
    """Happens-before over one launch: workgroup ids, and per global binding the last plain store and load of
    each element (workgroup, thread, that thread's clock) and what each integer atomic published."""

    def __init__(self) -> None:
        self.stores: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # id(binding) -> wg, thread, clock
        self.loads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.released: dict[tuple[int, int], dict[int, np.ndarray]] = {}  # (id(binding), element) -> wg -> clocks
        self.block_ids: list[tuple[int, int, int]] = []

    def next_id(self, block_id: tuple[int, int, int]) -> int:
        self.block_ids.append(block_id)
        return len(self.block_ids) - 1

    def record(self, table: dict, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if id(mem) not in table:
            table[id(mem)] = (
                np.full(mem.size, -1, np.int64),
                np.zeros(mem.size, np.int64),
                np.zeros(mem.size, np.int64),
            )
        return table[id(mem)]


class _Pending:
    """A wgmma's accumulators before ``wgmma.wait_group`` retires its group: read then, not at issue."""

    def __init__(self, acc, parts: list[tuple[np.ndarray, int, int, int]]) -> None:
        self.acc, self.parts, self.value = acc, parts, None


class _Barrier:
    def __init__(self, count: int) -> None:
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0
        self.init = (-1, -1, 0)  # workgroup, thread and clock of its mbarrier.init
        self.arrived: dict[int, np.ndarray] = {}  # what the arrivals of this phase knew (wg -> clocks)
        self.completed: dict[int, np.ndarray] = {}  # ... of the last completed phase: what a wait acquires

    def settle(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1
            self.pending = self.count
            self.completed, self.arrived = self.arrived, {}


class _Hopper(_Block):
    """A workgroup running the sm_90a kernel."""

    def __init__(self, *args, clocks: _Clocks | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clocks = clocks or _Clocks()
        self.wid = self.clocks.next_id(self.block_id)
        # what each thread knows of each workgroup's threads ([threads, threads] clocks), what it released by
        # its last fence, and what its integer atomics read that its next fence acquires
        self.know: dict[int, np.ndarray] = {self.wid: np.eye(self.t, dtype=np.int64)}
        self.fenced: dict[int, np.ndarray] = {}
        self.acquired: dict[int, np.ndarray] = {}
        self.shared: np.ndarray | None = None  # element values by byte address - SHARED_BASE
        self.barriers: dict[int, _Barrier] = {}
        self.ops = 0  # ops run: a round of the scheduler that runs none is a deadlock
        self.rank, self.peers = 0, [self]  # the cluster: this workgroup's rank, all its workgroups
        self.finished = False
        self.cluster_barrier = {"arrived": 0, "phase": 0, "expected": self.t}
        self.wgmma_open: list[_Pending] = []  # issued, not yet committed
        self.wgmma_groups: list[list[_Pending]] = []  # committed, not yet retired

    def get(self, v: ir.Value):
        """A value; retired accumulators as their arrays (so they may cross region boundaries)."""
        out = super().get(v)
        return out.value if isinstance(out, _Pending) and out.value is not None else out

    # -- memory --------------------------------------------------------------------------------------
    def _global(self, address: int) -> tuple[np.ndarray, int]:
        binding, offset = divmod(int(address), GLOBAL)
        return self.bindings[binding - 1], offset

    def _smem_read(self, address: np.ndarray, elem_bytes: int = 2) -> np.ndarray:
        at = address - SHARED_BASE
        assert (address % elem_bytes == 0).all() and (at >= 0).all() and (at < self.shared.size).all(), (
            "shared read outside"
        )
        return self.shared[at]

    def _barrier(self, address: int) -> _Barrier:
        """The mbarrier at a shared address, or at a cluster address (``mapa``) of any workgroup of the cluster."""
        peer = self.peers[(address >> 32) & 0xF] if address & CLUSTER else self
        assert not peer.finished, "an arrival on the barrier of a workgroup that has exited"
        if address & 0xFFFFFFFF not in peer.barriers:  # the peer has not run its init yet: nothing waited for it
            raise Race(f"workgroup {self.block_id} uses the mbarrier at {address & 0xFFFFFFFF} of workgroup "
                       f"{peer.block_id} before its mbarrier.init, with no barrier after the init")  # fmt: skip
        return peer.barriers[address & 0xFFFFFFFF]

    def _uniform(self, v: ir.Value, group: _Group) -> int:
        vals = np.broadcast_to(np.asarray(self.get(v), np.int64), (self.t,))[self._active(group)]
        assert (vals == vals[0]).all(), f"emulator: {v} differs across the threads that use it"
        return int(vals[0])

    # -- happens-before ------------------------------------------------------------------------------
    def _table(self, table: dict[int, np.ndarray], wid: int) -> np.ndarray:
        if wid not in table:
            table[wid] = np.zeros((self.t, self.t), np.int64)
        return table[wid]

    def _tick(self, ts: np.ndarray) -> None:
        """After a release: the threads' later accesses are not covered by what they released."""
        self.know[self.wid][ts, ts] += 1

    def _meet(self, ts: np.ndarray) -> None:
        """``bar.sync`` of the threads ``ts`` of this workgroup: each knows (and has released) what any knew."""
        for table in (self.know, self.fenced):
            for m in table.values():
                m[ts] = m[ts].max(0)
        self._tick(ts)

    def _fence(self, ts: np.ndarray) -> None:
        """``membar.gl``: acquire what the threads' integer atomics read, release all they know."""
        for wid, m in self.acquired.items():
            k = self._table(self.know, wid)
            k[ts] = np.maximum(k[ts], m[ts])
        for wid, m in self.know.items():
            self._table(self.fenced, wid)[ts] = m[ts]
        self._tick(ts)

    def _atomic(self, mem: np.ndarray, flat: np.ndarray, ts: np.ndarray) -> None:
        """Integer ``atomic_rmw``s, thread by thread: read what earlier ones published, publish the last fence."""
        for e, th in zip(flat.tolist(), ts.tolist()):
            published = self.clocks.released.setdefault((id(mem), e), {})
            for wid, v in published.items():
                m = self._table(self.acquired, wid)
                m[th] = np.maximum(m[th], v)
            for wid, m in self.fenced.items():
                published[wid] = np.maximum(published[wid], m[th]) if wid in published else m[th].copy()

    def _seen(self, wid: np.ndarray, th: np.ndarray, readers: np.ndarray) -> np.ndarray:
        """The clock each reader (a thread of this workgroup) knows of thread ``th`` of workgroup ``wid``."""
        out = np.zeros(len(th), np.int64)
        for w in np.unique(wid).tolist():
            at = wid == w
            if w in self.know:
                out[at] = self.know[w][readers[at], th[at]]
        return out

    def _ordered(self, mem: np.ndarray, flat: np.ndarray, ts: np.ndarray, store: bool) -> None:
        """A plain global access of the threads ``ts`` (``flat``: [threads, elements]) after the last other
        thread's store to each element (a store: also after its last other load); then recorded."""
        readers = np.broadcast_to(ts[:, None], flat.shape).ravel()
        flat = flat.ravel()
        for kind, table in (("stored", self.clocks.stores), ("loaded", self.clocks.loads))[: 1 + store]:
            wid, th, clock = (a[flat] for a in self.clocks.record(table, mem))
            other = (wid >= 0) & ~((wid == self.wid) & (th == readers))
            bad = other & (self._seen(wid, th, readers) < clock)
            if bad.any():
                i = int(np.argmax(bad))
                which = next((b for b, arr in self.bindings.items() if arr is mem), "?")
                at = tuple(int(v) for v in np.unravel_index(flat[i], mem.shape))
                theirs = self.clocks.block_ids[wid[i]]
                raise Race(f"thread {readers[i]} of workgroup {self.block_id} {'stores' if store else 'loads'} "
                           f"element {at} of binding {which} that thread {th[i]} of workgroup {theirs} {kind} with "
                           "no barrier, fence or flag ordering the two")  # fmt: skip
        wid, th, clock = self.clocks.record(self.clocks.stores if store else self.clocks.loads, mem)
        wid[flat], th[flat], clock[flat] = self.wid, readers, self.know[self.wid][readers, readers]

    def _initialized(self, bar: _Barrier, ts: np.ndarray, what: str) -> None:
        """Every other thread using an mbarrier knows its init (a barrier after ``mbarrier.init``)."""
        wid, th, clock = bar.init
        ts = ts[~((wid == self.wid) & (ts == th))]
        seen = self._seen(np.full(len(ts), wid), np.full(len(ts), th), ts)
        if (seen < clock).any():
            raise Race(f"thread {ts[np.argmax(seen < clock)]} of workgroup {self.block_id} {what} an mbarrier that "
                       f"thread {th} of workgroup {self.clocks.block_ids[wid]} initialized, with no barrier after the "
                       "init")  # fmt: skip

    def _global_access(self, op: ir.Operation, group: _Group) -> None:
        """The race check of a plain load or store, or an integer atomic, on a global binding."""
        name, ins = op.name, list(op.operands)
        at = {"memref.load": 0, "vector.load": 0, "vector.store": 1, "memref.store": 1, "memref.atomic_rmw": 1}[name]
        mem = self.get(ins[at])
        if not isinstance(mem, np.ndarray):
            return
        if name == "memref.atomic_rmw" and ir.IntegerAttr(op.attributes["kind"]).value != 1:
            return  # f32 adds (split-K into C): they commute; only integer flags and counters order anything
        ts = np.flatnonzero(self._active(group))
        idx = [self.idx(v)[ts] for v in ins[at + 1 :]]
        flat = np.ravel_multi_index(tuple(idx), mem.shape)
        if name == "memref.atomic_rmw":
            self._atomic(mem, flat, ts)
            return
        vec = op.results[0].type if name == "vector.load" else ins[0].type if name == "vector.store" else None
        n = ir.VectorType(vec).shape[-1] if vec is not None else 1
        self._ordered(mem, flat[:, None] + np.arange(n), ts, store=at == 1)

    # -- ops -----------------------------------------------------------------------------------------
    def step(self, op: ir.Operation, group: _Group):  # noqa: C901 - one branch an op
        self.ops += 1
        name = op.name
        ins, res = list(op.operands), list(op.results)
        if name == "memref.alloc" and "workgroup" in str(res[0].type):
            self.shared = np.full(ir.MemRefType(res[0].type).shape[0], np.nan, np.float32)
            self.env[res[0]] = ("shared", SHARED_BASE)
            return None
        if name == "memref.extract_aligned_pointer_as_index":
            src = self.get(ins[0])
            if isinstance(src, tuple):
                self.env[res[0]] = np.int64(src[1])
            else:
                which = next(i for i, b in self.bindings.items() if b is src)
                self.env[res[0]] = np.int64((which + 1) * GLOBAL)
            return None
        if name in ("llvm.inttoptr", "llvm.addrspacecast", "arith.extui", "arith.trunci"):
            self.env[res[0]] = self.get(ins[0])
            return None
        if name == "llvm.mlir.undef":
            size = len(str(res[0].type).split(","))
            self.env[res[0]] = np.full((self.t, size), np.nan, np.float32)
            return None
        if name == "llvm.insertvalue":
            (pos,) = ir.DenseI64ArrayAttr(op.attributes["position"])
            out = np.array(self.get(ins[0]))
            out[:, pos] = self.get(ins[1])
            self.env[res[0]] = out
            return None
        if name == "llvm.extractvalue":
            (pos,) = ir.DenseI64ArrayAttr(op.attributes["position"])
            acc = self.get(ins[0])
            if isinstance(acc, _Pending):
                assert acc.value is not None, "accumulators read before wgmma.wait_group retired their wgmma"
                acc = acc.value
            self.env[res[0]] = acc[:, pos]
            return None
        if name == "nvvm.mbarrier.init":
            address = self._uniform(ins[0], group)
            assert self._active(group).sum() == 1, "mbarrier.init by more than one thread"
            self.barriers[address] = _Barrier(self._uniform(ins[1], group))
            th = int(np.flatnonzero(self._active(group))[0])
            self.barriers[address].init = (self.wid, th, int(self.know[self.wid][th, th]))
            return None
        if name in ("nvvm.mbarrier.arrive", "nvvm.mbarrier.arrive.expect_tx"):
            bar = self._barrier(self._uniform(ins[0], group))
            self._initialized(bar, np.flatnonzero(self._active(group)), "arrives on")
            arrivals = int(self._active(group).sum())
            if name.endswith("expect_tx"):
                bar.tx += arrivals * self._uniform(ins[1], group)
            bar.pending -= arrivals
            assert bar.pending >= 0, "more arrivals than the mbarrier's count in one phase"
            ts = np.flatnonzero(self._active(group))
            for wid, m in self.know.items():  # an arrive releases (PTX: .release by default)
                v = m[ts].max(0)
                bar.arrived[wid] = np.maximum(bar.arrived[wid], v) if wid in bar.arrived else v
            self._tick(ts)
            bar.settle()
            for r in res:
                self.env[r] = np.int64(0)
            return None
        if name == "nvvm.mbarrier.try_wait.parity":
            address, parity = self._uniform(ins[0], group), self._uniform(ins[1], group)
            self._initialized(self._barrier(address), np.flatnonzero(self._active(group)), "waits on")
            while self.barriers[address].phase == parity:  # the phase of that parity has not completed
                yield ("spin", address, 0, 0)
            ts = np.flatnonzero(self._active(group))
            for wid, v in self.barriers[address].completed.items():  # and a passed wait acquires
                m = self._table(self.know, wid)
                m[ts] = np.maximum(m[ts], v)
            return None
        if name == "nvvm.cp.async.bulk.tensor.shared.cluster.global":
            self._tma(op, ins, group)
            return None
        if name == "nvvm.wgmma.mma_async":
            self._wgmma(op, ins, res, group)
            return None
        if name == "nvvm.setmaxregister":
            regs = _attr_int(op.attributes["regCount"])
            assert regs % 8 == 0 and 24 <= regs <= 256, f"setmaxnreg {regs}"
            return None
        if name == "nvvm.wgmma.commit.group.sync.aligned":
            self.wgmma_groups.append(self.wgmma_open)
            self.wgmma_open = []
            return None
        if name == "nvvm.wgmma.wait.group.sync.aligned":
            while len(self.wgmma_groups) > _attr_int(op.attributes["group"]):
                for pending in self.wgmma_groups.pop(0):
                    self._retire(pending)
            return None
        if name == "nvvm.wgmma.fence.aligned":
            return None
        if name == "scf.if" and len(op.regions[1].blocks) and not res:
            cond = np.broadcast_to(np.asarray(self.get(ins[0]), bool), (self.t,))
            active = self._active(group)
            branches = [(op.regions[0].blocks[0], cond & active), (op.regions[1].blocks[0], ~cond & active)]
            if all(m.any() for _, m in branches):  # the threads diverge: warp roles
                yield from self._fork(branches)
                return None
        if name == "nvvm.read.ptx.sreg.cluster.ctarank":
            self.env[res[0]] = np.int64(self.rank)
            return None
        if name == "nvvm.mapa":
            address, rank = self._uniform(ins[0], group), self._uniform(ins[1], group)
            self.env[res[0]] = np.int64(CLUSTER | (rank << 32) | address)
            return None
        if name == "nvvm.fence.mbarrier.init":
            return None
        if name == "nvvm.cluster.arrive":
            cb = self.cluster_barrier
            group.cluster_phase = cb["phase"]
            ts = np.flatnonzero(self._active(group))
            released = cb.setdefault("clocks", {}).setdefault(cb["phase"], ({}, {}))  # what its waiters learn
            for table, into in zip((self.know, self.fenced), released):
                for wid, m in table.items():
                    v = m[ts].max(0)
                    into[wid] = np.maximum(into[wid], v) if wid in into else v
            self._tick(ts)
            cb["arrived"] += int(self._active(group).sum())
            if cb["arrived"] == cb["expected"]:
                cb["arrived"], cb["phase"] = 0, cb["phase"] + 1
            return None
        if name == "nvvm.cluster.wait":
            assert getattr(group, "cluster_phase", None) is not None, "barrier.cluster.wait without its arrive"
            while self.cluster_barrier["phase"] == group.cluster_phase:
                yield ("spin", "cluster", 0, 0)
            ts = np.flatnonzero(self._active(group))
            for table, released in zip((self.know, self.fenced), self.cluster_barrier["clocks"][group.cluster_phase]):
                for wid, v in released.items():
                    m = self._table(table, wid)
                    m[ts] = np.maximum(m[ts], v)
            group.cluster_phase = None
            return None
        if name == "scf.while":  # a flag wait (StreamK): spin, letting the other workgroups run, until it holds
            before, after = op.regions[0].blocks[0], op.regions[1].blocks[0]
            while True:
                ops = self.ops
                for inner in before.operations:
                    if inner.operation.name == "scf.condition":
                        cond = np.broadcast_to(np.asarray(self.get(inner.operation.operands[0]), bool), (self.t,))
                        break
                    yield from self.step(inner.operation, group)
                if not cond[self._active(group)].any():
                    return None
                yield from self.run(after, group)
                self.ops = ops  # a poll that sees nothing new is no progress (a wait nothing will end deadlocks)
                yield ("spin", "flag", 0, 0)
        if name == "nvvm.barrier":  # a named barrier inside a role: every thread of each id's count, in step
            view = op.opview
            active = self._active(group)
            ids = np.broadcast_to(np.asarray(self.get(view.barrierId), np.int64), (self.t,))[active]
            count = self._uniform(view.numberOfThreads, group)
            for bid in np.unique(ids):
                assert (ids == bid).sum() == count, f"bar.sync {bid} reached by {(ids == bid).sum()} of {count}"
                self._meet(np.flatnonzero(active)[ids == bid])
            return None
        if name == "gpu.barrier":  # bar.sync 0 of the whole workgroup (outside the roles)
            self._meet(np.flatnonzero(self._active(group)))
        if name == "nvvm.memory.barrier":
            self._fence(np.flatnonzero(self._active(group)))
            return None
        if name in ("memref.load", "vector.load", "vector.store", "memref.store", "memref.atomic_rmw"):
            out = yield from super().step(op, group)  # the access first: its bounds are checked there
            self._global_access(op, group)
            return out
        out = yield from super().step(op, group)
        return out

    def _tma(self, op, ins, group: _Group) -> None:
        assert self._active(group).sum() == 1, "a TMA issued by more than one thread"
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        dst, tmap = self._uniform(ins[0], group), self._uniform(ins[1], group)
        coords = [self._uniform(v, group) for v in ins[2 : 2 + seg[2]]]
        bar = self._uniform(ins[2 + seg[2]], group)
        offsets = [self._uniform(v, group) for v in ins[3 + seg[2] : 3 + seg[2] + seg[4]]]
        at = sum(seg[:5])
        mask = self._uniform(ins[at], group) if seg[5] else 1 << self.rank
        for rank in range(len(self.peers)):
            if mask >> rank & 1:
                bar_at = self._barrier(CLUSTER | rank << 32 | bar)
                self._initialized(bar_at, np.flatnonzero(self._active(group)), "completes")
                if offsets:
                    self.peers[rank]._land_im2col(dst, tmap, coords, offsets, bar)
                else:
                    self.peers[rank]._land(dst, tmap, coords, bar)
        assert mask >> len(self.peers) == 0, f"multicast mask {mask:#x} names workgroups outside the cluster"

    def _land(self, dst: int, tmap: int, coords: list[int], bar: int) -> None:
        """The box of ``tmap`` at ``coords`` written into this workgroup's shared memory, its bytes completed
        on this workgroup's barrier at ``bar``."""
        mem, offset = self._global(tmap)
        magic, binding, rows, k, box_rows, box_k, esize = (
            int(v) for v in mem[offset : offset + 128].view(np.int64)[:7]
        )
        assert magic == MAP_MAGIC, "TMA through something that is not a tensor map"
        assert dst % 1024 == 0, f"TMA box at {dst}: a 128-byte swizzled tile must be 1024-aligned"
        src = self.bindings[int(binding)]
        k0, r0 = coords
        assert k0 * esize % 16 == 0, f"TMA at column {k0}: the innermost coordinate must be 16-byte aligned on sm_90a"
        box = np.zeros((box_rows, box_k), np.float32)  # out of bounds: zero (OOB fill none)
        r_hi, k_hi = max(min(r0 + box_rows, rows), r0), max(min(k0 + box_k, k), k0)  # wholly outside: all zero
        box[: r_hi - r0, : k_hi - k0] = src[r0:r_hi, k0:k_hi]
        r, c = np.meshgrid(np.arange(box_rows), np.arange(box_k), indexing="ij")
        address = _swizzle128(dst + r * esize * box_k + esize * c)
        self.shared[address - SHARED_BASE] = box
        b = self.barriers[bar]
        b.tx -= box.size * esize
        b.settle()

    def _land_im2col(self, dst: int, tmap: int, coords: list[int], offsets: list[int], bar: int) -> None:
        """TMA im2col (PTX ISA "im2col mode"): ``pixels`` rows of ``channels`` channels, the pixels walked
        from ``coords`` (c, then the spatial dims innermost first, then n) through each image's bounding box at
        the traversal strides (W, then H, then D, then N), each read at its position plus the im2col offsets
        (one a spatial dim, innermost first); zero outside the tensor."""
        mem, offset = self._global(tmap)
        fields = [int(v) for v in mem[offset : offset + 128].view(np.int32)]
        magic, binding, rank, pixels, channels = fields[:5]
        assert magic == IM2COL_MAGIC, "an im2col TMA through something that is not an im2col tensor map"
        assert dst % 1024 == 0, f"TMA box at {dst}: a 128-byte swizzled tile must be 1024-aligned"
        shape = fields[5 : 7 + rank]  # n, spatial outermost first, c
        lower, upper, strides = (fields[7 + rank + i * rank : 7 + rank + (i + 1) * rank] for i in range(3))
        assert len(coords) == rank + 2 and len(offsets) == rank, (
            f"a {rank + 2}-D im2col load takes {rank + 2} coordinates and {rank} offsets"
        )
        bits = CORNER_BITS[rank]
        assert all(-(1 << bits - 1) <= v < 1 << bits - 1 for v in (*lower, *upper)), f"corners {lower} {upper}"
        src = self.bindings[binding]
        n, *spatial, c = shape
        size = spatial[::-1]  # innermost first, as coords and offsets
        c0, pos, img = coords[0], list(coords[1:-1]), coords[-1]
        assert c0 * 2 % 16 == 0, f"im2col TMA at channel {c0}: the innermost coordinate must be 16-byte aligned"
        off = [int(np.int16(v)) for v in offsets]  # the instruction's offsets are 16-bit
        assert all(0 <= v < 1 << bits for v in off), f"im2col offsets {off} past {bits} bits"
        assert all(lo <= v <= dim - 1 + up for v, lo, dim, up in zip(pos, lower, size, upper)), (
            f"im2col start {pos} outside the box"
        )
        box = np.zeros((pixels, channels), np.float32)
        for p in range(pixels):
            at = [v + o for v, o in zip(pos, off)]
            if 0 <= img < n and all(0 <= v < dim for v, dim in zip(at, size)):
                hi = min(c0 + channels, c)
                box[p, : hi - c0] = src[(img, *at[::-1], slice(c0, hi))]
            for i in range(rank):  # the next position: the innermost dim first, carrying into the next
                pos[i] += strides[i]
                if pos[i] <= size[i] - 1 + upper[i]:
                    break
                pos[i] = lower[i]
            else:
                img += 1
        r, col = np.meshgrid(np.arange(pixels), np.arange(channels), indexing="ij")
        address = _swizzle128(dst + r * 2 * channels + 2 * col)
        self.shared[address - SHARED_BASE] = box
        b = self.barriers[bar]
        b.tx -= box.size * 2
        b.settle()

    def _wgmma(self, op, ins, res, group: _Group) -> None:
        """Issue: the descriptors are read now, shared memory only when the group retires (as late as
        the PTX ISA allows, so a stage released or refilled too early shows in the result)."""
        shape = str(op.attributes["shape"])
        n = int(shape.split("n = ")[1].split(",")[0])
        active = np.flatnonzero(self._active(group))
        # MN-major operands (the transpose bits): A in "col", B in "row" layout
        mn_major = ("<col>" in str(op.attributes["layoutA"]), "<row>" in str(op.attributes["layoutB"]))
        types = tuple(str(op.attributes[f"type{x}"]).split("<")[1].rstrip(">") for x in "AB")
        k = int(shape.split("k = ")[1].split(">")[0])
        eight = [ty in FP8 for ty in types]
        assert eight[0] == eight[1], f"wgmma {types}: 8-bit and 16-bit operands mixed"
        assert k == (32 if eight[0] else 16), f"wgmma k = {k} for {types}"
        assert not (eight[0] and any(mn_major)), "8-bit wgmma operands are K-major only (no transpose)"
        parts = []
        for first in sorted({int(t) // 128 * 128 for t in active}):
            lanes = np.arange(first, first + 128)
            assert np.isin(lanes, active).all(), "a wgmma without its whole warpgroup"
            parts.append((lanes, self._uniform_at(ins[1], first), self._uniform_at(ins[2], first), n, mn_major, types))
        # scale-d 0: D = A B, the accumulator input ignored
        pending = _Pending(None if "zero" in str(op.attributes["scaleD"]) else self.get(ins[0]), parts)
        self.wgmma_open.append(pending)
        self.env[res[0]] = pending

    def _retire(self, pending: _Pending) -> None:
        acc = pending.acc
        if isinstance(acc, _Pending):
            assert acc.value is not None, "a wgmma chained on one not yet retired"
            acc = acc.value
        out = np.array(acc, np.float32) if acc is not None else np.zeros((self.t, pending.parts[0][3] // 2), np.float32)
        for lanes, desc_a, desc_b, n, (mn_a, mn_b), (ty_a, ty_b) in pending.parts:
            d = self._operand(desc_a, 64, mn_a, ty_a) @ self._operand(desc_b, n, mn_b, ty_b).T
            row, col = d_fragment(n)
            out[lanes] = out[lanes] + d[row, col]
        pending.value = out

    def _uniform_at(self, v: ir.Value, lane: int) -> int:
        return int(np.broadcast_to(np.asarray(self.get(v), np.int64), (self.t,))[lane])

    def _operand(self, desc: int, rows: int, mn_major: bool = False, kind: str = "f16") -> np.ndarray:
        """A ``rows x 16`` (8-bit ``kind``: ``rows x 32``, codes decoded as e4m3 / e5m2) operand through its
        descriptor (128-byte swizzle). K-major: 8-row groups ``stride`` apart, each row 32 bytes of K
        elements of a 128-byte row. MN-major (CUTLASS's canonical SW128
        layout): K rows of 64 MN-elements (128 bytes), 8 K rows an atom, the next 8 K rows ``stride``
        further, the next 64 MN-elements ``lead`` further."""
        start = (desc & 0x3FFF) << 4
        lead = ((desc >> 16) & 0x3FFF) << 4
        stride = ((desc >> 32) & 0x3FFF) << 4
        assert desc >> 62 == 1, f"descriptor swizzle mode {desc >> 62}, not 128-byte"
        esize = 1 if kind in FP8 else 2
        r, k = np.meshgrid(np.arange(rows), np.arange(32 // esize), indexing="ij")
        if mn_major:
            address = start + (r // 64) * lead + (k // 8) * stride + (k % 8) * 128 + 2 * (r % 64)
        else:
            address = start + (r // 8) * stride + (r % 8) * 128 + esize * k
        values = self._smem_read(_swizzle128(address), esize).astype(np.float64)
        if esize == 1:  # the bytes as the wgmma type reads them; unwritten (NaN) stays NaN
            codes = np.nan_to_num(values).astype(np.uint8)
            values = np.where(np.isnan(values), np.nan, codes.view(FP8[kind]).astype(np.float64))
        return values

    def _fork(self, branches):
        """Roles interleaved: each runs until it blocks (a spinning mbarrier or cluster wait); when none
        can go on, the fork spins too, so that the other workgroup of a cluster runs (a generator)."""
        groups = [_Group(m) for _, m in branches]
        for g in groups:
            g.cluster_phase = None
        gens = [self.run(b, g) for (b, _), g in zip(branches, groups)]
        order = list(range(len(gens))) if self.first == "then" else list(reversed(range(len(gens))))
        done = [False] * len(gens)
        while not all(done):
            before = self.ops
            for i in order:
                while not done[i]:
                    try:
                        kind, *_ = next(gens[i])
                    except StopIteration:
                        done[i] = True
                        break
                    assert kind == "spin", "emulator: bar.sync inside warp roles is not modelled for sm_90a"
                    break
            if self.ops == before and not all(done):
                yield ("spin", None, 0, 0)


def run_gemm(module: ir.Module, a: np.ndarray, b: np.ndarray, box: tuple[int, int], out_dtype=np.float32,
             scales: tuple[float, float] | None = None, partials: int = 0) -> np.ndarray:  # fmt: skip
    """C = A B^T by the module's kernel (A, B: 16-bit or ml_dtypes fp8 ``[M, K]``, ``[N, K]``; ``box``: the
    rows of A's and B's TMA boxes, the tile's bm and bn; ``scales``: fp8's (scale_a, scale_b) binding;
    ``partials``: C is ``[partials, M, N]``, each split's slice, NaN where unwritten), workgroups in grid order."""
    from sm80_emulator import _workgroup, collect_funcs

    exe = next(o.operation for o in module.body.operations if o.operation.name == "hal.executable.source")
    export = next(o for o in _walk(exe) if o.name == "hal.executable.export")
    (func,) = collect_funcs(exe)
    grid, threads = _workgroup(export)
    m, k = a.shape
    n = b.shape[0]
    bm, bn = box
    esize = a.dtype.itemsize
    if esize == 1:  # global memory holds the codes; the wgmma's type attribute says how to read them
        a, b = a.view(np.uint8), b.view(np.uint8)
    box_k = 128 // esize
    maps = np.concatenate([tensor_map(0, m, k, bm, box_k, esize), tensor_map(1, n, k, bn, box_k, esize)])
    c = np.full((m, n), np.nan if grid[2] == 1 else 0.0, out_dtype)  # split-K adds into a zeroed C
    if partials:
        c = np.full((partials, m, n), np.nan, out_dtype)
    extra = [] if scales is None else [np.asarray(scales, np.float32)]
    bindings = dict(enumerate([a, b, maps, *extra, c]))
    body = func.regions[0].blocks[0]
    clocks = _Clocks()
    attrs = func.attributes
    size = list(ir.DenseI32ArrayAttr(attrs["nvvm.cluster_dim"]))[0] if "nvvm.cluster_dim" in attrs else 1
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x0 in range(0, grid[0], size):
                _run_cluster(
                    [_Hopper(threads, (x, y, z), bindings, "then", clocks=clocks) for x in range(x0, x0 + size)], body
                )
    return c


def run_conv(module: ir.Module, dy: np.ndarray, x: np.ndarray, geometry, out_dtype=np.float32) -> np.ndarray:
    """dW ``[G, K, Y X C]`` (or its split partials) by the module's conv kernel (``geometry``: its
    ``convbw_mlir.kernels.conv_sm90.ConvSm90``; dy ``[N Ho Wo, G K]``, x ``[N, *spatial, G C]``)."""
    from sm80_emulator import _workgroup, collect_funcs

    from convbw_mlir.kernels.conv_sm90 import BOX

    g = geometry
    exe = next(o.operation for o in module.body.operations if o.operation.name == "hal.executable.source")
    export = next(o for o in _walk(exe) if o.name == "hal.executable.export")
    (func,) = collect_funcs(exe)
    grid, threads = _workgroup(export)
    lower, upper = g.corners()
    maps = np.concatenate([
        tensor_map(0, g.reduction, g.groups * g.k, g.tiling.bk, BOX),
        im2col_map(1, x.shape, lower, upper, g.stride[::-1], g.tiling.bk, BOX),
    ])  # fmt: skip
    shape = (g.groups, g.k, g.columns) if g.splits == 1 else (g.splits, g.groups, g.k, g.columns)
    c = np.full(shape, np.nan, out_dtype if g.splits == 1 else np.float32)
    body = func.regions[0].blocks[0]
    clocks = _Clocks()
    if g.streamk:  # every workgroup at once (a persistent grid), the last first: a missing wait reads NaN
        flags = np.zeros((g.streamk, g.tiling.consumers), np.int32)
        bindings = dict(enumerate([dy, x, maps, np.full(g.sk_partials, np.nan, np.float32), flags, c]))
        _run_cluster(
            [_Hopper(threads, (w, 0, 0), bindings, "then", clocks=clocks) for w in reversed(range(grid[0]))], body
        )
        assert not flags.any(), f"StreamK's flags left raised: {flags.tolist()}"
        return c
    if g.fused:  # workgroups one after another, the last split first: whoever arrives last sums
        counters = np.zeros(g.counters, np.int32)
        c = np.full((g.groups, g.k, g.columns), np.nan, out_dtype)
        partials = np.full((g.splits, g.groups, g.k, g.columns), np.nan, np.float32)
        bindings = dict(enumerate([dy, x, maps, partials, counters, c]))
        for z in reversed(range(grid[2])):
            for y in range(grid[1]):
                for xx in range(grid[0]):
                    _run_cluster([_Hopper(threads, (xx, y, z), bindings, "then", clocks=clocks)], body)
        assert not counters.any(), "the fused split's counters left raised"
        return c
    bindings = dict(enumerate([dy, x, maps, c]))
    for z in range(grid[2]):
        for y in range(grid[1]):
            for xx in range(grid[0]):
                _run_cluster([_Hopper(threads, (xx, y, z), bindings, "then", clocks=clocks)], body)
    return c


def dw_of_plan(p, plan, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW ``[G, K, Y X C]`` of ``plan``'s sm_90a conv kernel as the pass builds it (plain, padded, boxed, split or
    StreamK), on ``p``'s inputs ``x`` and ``dy``; split partials summed here (an element never written stays NaN)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.kernels.conv_sm90 import from_problem
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

    t = plan.tile
    merged = plan.merge.groups if plan.merge is not None else 0
    sk = plan.streamk.workgroups if plan.streamk is not None else 0
    g = from_problem(p, Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages), plan.k_batch, sk, merged)
    with new_context():
        module = convbw.build_module(p, plan)
        ExplicitKernel().run(module.operation)
        out = run_conv(module, dy.reshape(g.reduction, -1), x.reshape(*x.shape[:-2], -1), g)
    return out.sum(0) if out.ndim == 4 else out


def max_error_of_plan(p, plan, seed: int = 1) -> float:
    """The largest |dW - float64| over max |float64| of ``plan``'s sm_90a conv kernel as the pass builds it
    (:func:`dw_of_plan`); NaN anywhere (an element never written) fails."""
    from convbw_mlir.reference import random_inputs, reference

    x, dy = random_inputs(p, seed=seed)
    want = reference(p, x, dy)
    got = dw_of_plan(p, plan, x, dy).reshape(want.shape)
    assert not np.isnan(got).any()
    return float(np.abs(got - want).max() / np.abs(want).max())


def _run_cluster(blocks: list[_Hopper], body: ir.Block) -> None:
    """The workgroups of one cluster, interleaved: each runs until it spins; a round where none runs an op
    is a deadlock."""
    shared_barrier = {"arrived": 0, "phase": 0, "expected": sum(b.t for b in blocks)}
    for rank, block in enumerate(blocks):
        block.rank, block.peers, block.cluster_barrier = rank, blocks, shared_barrier
    gens = [block.run(body, _Group(None)) for block in blocks]
    done = [False] * len(gens)
    while not all(done):
        before = sum(b.ops for b in blocks)
        for i, gen in enumerate(gens):
            while not done[i]:
                try:
                    kind, bid, count, arrived = next(gen)
                except StopIteration:
                    done[i] = blocks[i].finished = True
                    blocks[i].know, blocks[i].fenced, blocks[i].acquired = {}, {}, {}  # its accesses are recorded
                    break
                if kind == "spin":
                    break
                assert kind == "sync" and arrived == count, f"barrier {bid} reached by {arrived} of {count}"
        if sum(b.ops for b in blocks) == before and not all(done):
            raise Deadlock("every role of every workgroup waits on a barrier that nothing will complete")


def _walk(op: ir.Operation):
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _walk(inner.operation)
