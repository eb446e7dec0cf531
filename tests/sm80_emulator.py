"""A numpy emulator of the explicit sm_80 kernel's IR (no GPU here): every thread of a workgroup at once.

It interprets the ops ``convbw_mlir.kernels.gemm_sm80`` and ``depthwise_sm80`` emit (arith, math.fma, gpu,
memref, vector, scf, nvvm's
cp.async groups, and nvgpu's ``device_async_copy``, ``ldmatrix`` and ``mma.sync`` with the PTX ISA's
fragment layouts), one value an array over the workgroup's threads, so that the kernel's numerics
(addresses, zero-fill, fragment wiring, masks) are checked on the CPU against a float64 reference.
Copies are asynchronous as the PTX ISA has them: a ``cp.async`` reads its source when issued and
lands in shared memory only when ``cp.async.wait_group`` retires its commit group (shared memory is
NaN until written, so a read before its copy landed shows as NaN in the result).

Warp roles (wave specialization): an ``scf.if`` with an else whose condition splits the active threads
forks them into two thread groups, each running its own branch, interleaved at barriers: ``bar.sync``
(``nvvm.barrier``, and ``gpu.barrier`` as barrier 0 of the whole workgroup) blocks a group until the
barrier's thread count has arrived, ``bar.arrive`` (``nvvm.barrier.arrive``) counts and goes on. A
group runs until it blocks (``first`` says which branch starts): a missing wait lets one role run
ahead and read or overwrite a stage too early; a wrong order deadlocks (raised as ``Deadlock``), and a
barrier left with arrivals at the join raises too.

A whole module (:func:`run_module`): the top-level function's tensor ops run in numpy (reshapes, fills,
transposes and their optimization barriers, any ``linalg.generic``: a split's stage 2, the lowering's gather
pads and contraction) and each ``flow.dispatch`` runs its kernel, workgroups one after another in grid
order. StreamK's flags work so: ``memref.atomic_rmw`` one thread at a time, an ``scf.while`` spin loop that outlasts
``SPIN_LIMIT`` (a wait on a later workgroup, which never runs first here) raises ``Deadlock``.
"""

from __future__ import annotations

import re

import numpy as np

from convbw_mlir.ir_imports import ir

WARP = 32
SPIN_LIMIT = 1000  # iterations of a spin loop before the wait counts as a deadlock


def _attr_int(a: ir.Attribute) -> int:
    return ir.IntegerAttr(a).value


def _float(t: ir.Type) -> np.dtype:
    """numpy's type of a 16-bit or f32 element (of ``t`` or of the vector or memref ``t``): bf16 is
    ml_dtypes', so a bf16 kernel rounds as the GPU does."""
    from convbw_mlir.problem import numpy_dtype

    text = str(t)
    return numpy_dtype("bf16") if "bf16" in text else np.dtype(np.float16 if "f16" in text else np.float32)


class Deadlock(AssertionError):
    """Every thread group of a fork waits at a barrier that no one else will complete."""


class _Group:
    """Threads running the same code: their mask (None: all) and their ``cp.async`` commit groups."""

    def __init__(self, mask: np.ndarray | None) -> None:
        self.mask = mask
        self.open: list[tuple] = []  # issued, not yet committed
        self.committed: list[list[tuple]] = []

    def wait(self, pending: int) -> None:
        """``cp.async.wait_group pending``: all but the newest ``pending`` commit groups land."""
        while len(self.committed) > pending:
            for dst, d, vals in self.committed.pop(0):
                dst[d[:-1]][d[-1] : d[-1] + len(vals)] = vals


class _Block:
    """One workgroup: ``threads`` lanes, its block ids, its shared allocations."""

    def __init__(self, threads: int, block_id: tuple[int, int, int], bindings: dict[int, np.ndarray],
                 first: str = "else") -> None:  # fmt: skip
        self.t = threads
        self.tid = np.arange(threads, dtype=np.int64)
        self.block_id = block_id
        self.bindings = bindings
        self.first = first
        self.env: dict[ir.Value, object] = {}

    def get(self, v: ir.Value):
        return self.env[v]

    def idx(self, v: ir.Value) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.env[v], dtype=np.int64), (self.t,))

    def _active(self, group: _Group) -> np.ndarray:
        return np.ones(self.t, bool) if group.mask is None else group.mask

    def run(self, block: ir.Block, group: _Group):
        """Run ``block`` for ``group`` (a generator: it yields barrier events, returns scf.yield's values)."""
        for op in block.operations:
            out = yield from self.step(op.operation, group)
            if op.operation.name in ("scf.yield",):
                return out
        return []

    def _fork(self, branches: list[tuple[ir.Block, np.ndarray]]):
        """Run each (block, mask) as its own thread group, interleaved at barriers (see the module doc)."""
        groups = [_Group(m) for _, m in branches]
        gens = [self.run(b, g) for (b, _), g in zip(branches, groups)]
        order = list(range(len(gens))) if self.first == "then" else list(reversed(range(len(gens))))
        barriers: dict[int, list] = {}  # id -> [threads expected, arrived, waiting groups]
        blocked, done = [False] * len(gens), [False] * len(gens)
        while not all(done):
            ran = False
            for i in order:
                while not (done[i] or blocked[i]):
                    ran = True
                    try:
                        kind, bid, n, k = next(gens[i])
                    except StopIteration:
                        done[i] = True
                        break
                    bar = barriers.setdefault(bid, [n, 0, []])
                    assert bar[0] == n, f"barrier {bid} used with {n} and {bar[0]} threads"
                    bar[1] += k
                    if kind == "sync":
                        bar[2].append(i)
                        blocked[i] = True
                    assert bar[1] <= n, f"barrier {bid}: {bar[1]} arrivals of {n}"
                    if bar[1] == n:
                        for w in bar[2]:
                            blocked[w] = False
                        barriers[bid] = [n, 0, []]
            if not ran:
                waits = {b: v[1] for b, v in barriers.items() if v[2]}
                raise Deadlock(f"every thread group waits at a barrier (id: arrived so far) {waits}")
        left = {b: v[1] for b, v in barriers.items() if v[1]}
        assert not left, f"barriers left incomplete at the join (id: arrivals) {left}"
        for g in groups:
            assert not g.open and not g.committed, "a thread group ended with cp.async copies in flight"

    def step(self, op: ir.Operation, group: _Group):  # noqa: C901 - one branch an op
        """Run one op for ``group`` (a generator; barriers yield ``(kind, id, threads, arrivals)``)."""
        mask = group.mask
        yield from ()
        name = op.name
        ins = list(op.operands)
        res = list(op.results)
        if name == "arith.constant":
            attr = op.attributes["value"]
            t = res[0].type
            if isinstance(t, ir.VectorType):
                vt = ir.VectorType(t)
                val = ir.DenseElementsAttr(attr)
                fill = ir.FloatAttr(val.get_splat_value()).value if val.is_splat else 0.0
                self.env[res[0]] = np.full((self.t, *vt.shape), fill, np.float32)
            elif isinstance(t, (ir.IndexType, ir.IntegerType)):
                self.env[res[0]] = np.int64(ir.IntegerAttr(attr).value)
            else:
                self.env[res[0]] = np.float32(ir.FloatAttr(attr).value)
            return None
        binary = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
                  "arith.divui": np.floor_divide, "arith.remui": np.remainder, "arith.minsi": np.minimum,
                  "arith.maxsi": np.maximum, "arith.andi": np.bitwise_and, "arith.mulf": np.multiply,
                  "arith.minui": np.minimum, "arith.maxui": np.maximum, "arith.addf": np.add,
                  "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor, "arith.shli": np.left_shift,
                  "arith.shrui": np.right_shift}  # fmt: skip
        if name in binary:
            a, b = self.get(ins[0]), self.get(ins[1])
            self.env[res[0]] = binary[name](a, b)
            return None
        if name == "arith.cmpi":
            pred = _attr_int(op.attributes["predicate"])
            a, b = self.get(ins[0]), self.get(ins[1])
            self.env[res[0]] = {2: np.less, 0: np.equal, 1: np.not_equal, 3: np.less_equal, 4: np.greater,
                                5: np.greater_equal, 6: np.less, 7: np.less_equal, 8: np.greater,
                                9: np.greater_equal}[pred](a, b)  # fmt: skip  # indices: unsigned == signed
            return None
        if name == "arith.select":
            c, a, b = (self.get(v) for v in ins)
            c = np.asarray(c)
            if np.ndim(a) > 1 or np.ndim(b) > 1:
                c = c.reshape(c.shape + (1,) * (max(np.ndim(a), np.ndim(b)) - c.ndim))
            self.env[res[0]] = np.where(c, a, b)
            return None
        if name == "arith.extf":
            self.env[res[0]] = np.asarray(self.get(ins[0])).astype(np.float32)
            return None
        if name == "arith.index_cast":
            self.env[res[0]] = np.asarray(self.get(ins[0]), np.int64)
            return None
        if name == "arith.truncf":
            self.env[res[0]] = np.asarray(self.get(ins[0])).astype(_float(res[0].type))
            return None
        if name == "arith.extf":  # the depthwise kernel's f16/bf16 -> f32
            self.env[res[0]] = np.asarray(self.get(ins[0])).astype(np.float32)
            return None
        if name == "math.fma":  # rounded once on the GPU, twice here: within f32's rounding of the sum
            a, b, c = (np.asarray(self.get(v), np.float32) for v in ins)
            self.env[res[0]] = (a * b + c).astype(np.float32)
            return None
        if name == "gpu.thread_id":
            self.env[res[0]] = self.tid
            return None
        if name == "gpu.block_id":
            dim = str(op.attributes["dimension"])
            self.env[res[0]] = np.int64(self.block_id["xyz".index(dim[-2])])
            return None
        if name == "hal.interface.binding.subspan":
            self.env[res[0]] = self.bindings[_attr_int(op.attributes["binding"])]
            return None
        if name == "memref.alloc":
            mt = ir.MemRefType(res[0].type)
            self.env[res[0]] = np.full(mt.shape, np.nan, _float(mt))  # uninitialised: NaN shows a stray read
            return None
        if name == "nvvm.cp.async.commit.group":
            group.committed.append(group.open)
            group.open = []
            return None
        if name == "nvvm.cp.async.wait.group":
            group.wait(_attr_int(op.attributes["n"]))
            return None
        if name == "gpu.barrier":  # bar.sync 0: the whole workgroup
            yield ("sync", 0, self.t, int(self._active(group).sum()))
            return None
        if name in ("nvvm.barrier", "nvvm.barrier.arrive"):
            view = op.opview
            bid = int(self.get(view.barrierId)) if view.barrierId is not None else 0
            n = int(self.get(view.numberOfThreads)) if view.numberOfThreads is not None else self.t
            kind = "sync" if name == "nvvm.barrier" else "arrive"
            yield (kind, bid, n, int(self._active(group).sum()))
            return None
        if name == "nvgpu.device_async_copy":
            return self._async_copy(op, ins, res, group)
        if name == "memref.load":
            mem = self.get(ins[0])
            self.env[res[0]] = mem[tuple(self.idx(v) for v in ins[1:])]
            return None
        if name == "vector.load":  # per thread, n elements along the last index
            mem, idx = self.get(ins[0]), [self.idx(v) for v in ins[1:]]
            n = ir.VectorType(res[0].type).shape[-1]
            out = np.zeros((self.t, n), mem.dtype)
            for th in range(self.t) if mask is None else np.flatnonzero(mask):
                d = tuple(i[th] for i in idx)
                assert d[-1] + n <= mem.shape[-1], f"load past the row: {d} + {n} of {mem.shape}"
                out[th] = mem[d[:-1]][d[-1] : d[-1] + n]
            self.env[res[0]] = out
            return None
        if name == "vector.from_elements":
            self.env[res[0]] = np.stack([np.broadcast_to(self.get(v), (self.t,)) for v in ins], axis=1)
            return None
        if name == "vector.store":
            self._store(ins, mask)
            return None
        if name == "vector.extract":
            pos = list(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
            self.env[res[0]] = self.get(ins[0])[(slice(None), *pos)]
            return None
        if name == "vector.extract_strided_slice":
            offs = [ir.IntegerAttr(a).value for a in ir.ArrayAttr(op.attributes["offsets"])]
            sizes = [ir.IntegerAttr(a).value for a in ir.ArrayAttr(op.attributes["sizes"])]
            sl = tuple(slice(o, o + s) for o, s in zip(offs, sizes))
            self.env[res[0]] = self.get(ins[0])[(slice(None), *sl)]
            return None
        if name == "nvgpu.ldmatrix":
            return self._ldmatrix(op, ins, res, mask)
        if name == "nvgpu.mma.sync":
            return self._mma(ins, res)
        if name == "scf.for":
            lo, hi, st = (int(self.get(v)) for v in ins[:3])
            carried = [self.get(v) for v in ins[3:]]
            body = op.regions[0].blocks[0]
            args = list(body.arguments)
            for i in range(lo, hi, st):
                self.env[args[0]] = np.int64(i)
                for a, v in zip(args[1:], carried):
                    self.env[a] = v
                carried = yield from self.run(body, group)
            for r, v in zip(res, carried):
                self.env[r] = v
            return None
        if name == "scf.yield":
            return [self.get(v) for v in ins]
        if name == "scf.if":
            cond = np.broadcast_to(np.asarray(self.get(ins[0]), bool), (self.t,))
            active = self._active(group)
            branches = [(op.regions[0].blocks[0], cond & active)]
            if len(op.regions[1].blocks):
                branches.append((op.regions[1].blocks[0], ~cond & active))
            taken = [(b, m) for b, m in branches if m.any()]
            if len(taken) == 2 and not res:  # the threads diverge: warp roles
                self._fork(taken)
                return None
            for b, m in taken:  # one branch after the other, each for its threads (no barrier between)
                sub = _Group(m)
                sub.open, sub.committed = group.open, group.committed
                out = yield from self.run(b, sub)
                group.open, group.committed = sub.open, sub.committed
                for r, v in zip(res, out or []):  # each thread takes its own branch's value
                    v = np.broadcast_to(v, (self.t, *np.shape(v)[1:])) if np.ndim(v) else np.full(self.t, v)
                    old = self.env.get(r, v)
                    self.env[r] = np.where(m.reshape(m.shape + (1,) * (v.ndim - 1)), v, old)
            return None
        if name == "scf.while":  # a spin loop (StreamK's flag wait): before region, then the body
            before, after = op.regions[0].blocks[0], op.regions[1].blocks[0]
            for _ in range(SPIN_LIMIT):
                cond = None
                for inner in before.operations:
                    if inner.operation.name == "scf.condition":
                        cond = np.broadcast_to(np.asarray(self.get(inner.operation.operands[0]), bool), (self.t,))
                        break
                    yield from self.step(inner.operation, group)
                if not cond[self._active(group)].any():
                    return None
                yield from self.run(after, group)
            raise Deadlock(f"scf.while spun {SPIN_LIMIT} times: a flag no earlier workgroup sets")
        if name == "memref.atomic_rmw":  # one thread after another, each sees the previous one's result
            kind = ir.IntegerAttr(op.attributes["kind"]).value
            assert kind in (0, 1), f"emulator: atomic_rmw kind {kind} (only addf, addi)"
            value, mem = self.get(ins[0]), self.get(ins[1])
            idx = [self.idx(v) for v in ins[2:]]
            old = np.zeros(self.t, mem.dtype)
            for th in np.flatnonzero(self._active(group)):
                d = tuple(i[th] for i in idx)
                old[th] = mem[d]
                mem[d] += np.broadcast_to(value, (self.t,))[th]
            self.env[res[0]] = old
            return None
        if name == "vector.load":
            mem = self.get(ins[0])
            idx = [self.idx(v) for v in ins[1:]]
            n = ir.VectorType(res[0].type).shape[-1]
            out = np.zeros((self.t, n), mem.dtype)
            for th in np.flatnonzero(self._active(group)):
                d = tuple(i[th] for i in idx)
                assert d[-1] + n <= mem.shape[-1], f"load past the row: {d} + {n} of {mem.shape}"
                out[th] = mem[d[:-1]][d[-1] : d[-1] + n]
            self.env[res[0]] = out
            return None
        if name == "vector.broadcast":  # the grouped depthwise form's dy value over a vector of in channels
            n = ir.VectorType(res[0].type).shape[-1]
            src = np.asarray(self.get(ins[0]))
            src = src.reshape(self.t, -1) if src.ndim else np.full((self.t, 1), src)
            self.env[res[0]] = np.broadcast_to(src, (self.t, n)).copy()
            return None
        if name == "vector.shape_cast":
            self.env[res[0]] = np.asarray(self.get(ins[0])).reshape((self.t, *ir.VectorType(res[0].type).shape))
            return None
        if name == "nvvm.memory.barrier":  # workgroups run one after another here: memory is always visible
            return None
        if name == "func.return":
            return None
        raise NotImplementedError(f"emulator: op {name}")

    def _async_copy(self, op, ins, res, group: _Group):
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        dst = self.get(ins[0])
        dst_idx = [self.idx(v) for v in ins[1 : 1 + seg[1]]]
        src = self.get(ins[1 + seg[1]])
        at = 2 + seg[1]
        src_idx = [self.idx(v) for v in ins[at : at + seg[3]]]
        n = _attr_int(op.attributes["dstElements"])
        count = self.idx(ins[at + seg[3]]) if seg[4] else np.full(self.t, n)
        for th in np.flatnonzero(self._active(group)):
            s = tuple(i[th] for i in src_idx)
            d = tuple(i[th] for i in dst_idx)
            vals = np.zeros(n, dst.dtype)
            k = int(count[th])
            if k:
                assert s[-1] + k <= src.shape[-1], f"copy past the row: {s} + {k} of {src.shape}"
                vals[:k] = src[s[:-1]][s[-1] : s[-1] + k]
            group.open.append((dst, d, vals))  # lands at the cp.async.wait_group that retires its group
        self.env[res[0]] = None

    def _store(self, ins, mask):
        val = np.asarray(self.get(ins[0]))
        mem = self.get(ins[1])
        idx = [self.idx(v) for v in ins[2:]]
        n = val.shape[-1]
        for th in range(self.t):
            if mask is not None and not mask[th]:
                continue
            d = tuple(i[th] for i in idx)
            assert d[-1] + n <= mem.shape[-1], f"store past the row: {d} + {n} of {mem.shape}"
            mem[d[:-1]][d[-1] : d[-1] + n] = val[th]

    def _ldmatrix(self, op, ins, res, mask):
        smem = self.get(ins[0])
        idx = [self.idx(v) for v in ins[1:]]
        tiles = _attr_int(op.attributes["numTiles"])
        trans = ir.BoolAttr(op.attributes["transpose"]).value
        rows = np.zeros((self.t, 8), smem.dtype)  # [T, 8]: each lane's row address (threads masked off: none)
        for th in range(self.t) if mask is None else np.flatnonzero(mask):
            rows[th] = smem[tuple(i[th] for i in idx[:-1])][idx[-1][th] : idx[-1][th] + 8]
        out = np.zeros((self.t, tiles, 2), smem.dtype)
        for w in range(self.t // WARP):
            lanes = rows[w * WARP : (w + 1) * WARP]
            for q in range(tiles):
                m = lanes[8 * q : 8 * q + 8]  # matrix q: rows from lanes 8q..8q+7
                if trans:
                    m = m.T
                for lane in range(WARP):
                    out[w * WARP + lane, q] = m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2]
        self.env[res[0]] = out

    def _mma(self, ins, res):
        a, b, c = (np.asarray(self.get(v)) for v in ins)
        d = np.zeros((self.t, 2, 2), np.float32)
        for w in range(self.t // WARP):
            A = np.zeros((16, 16), np.float32)
            B = np.zeros((16, 8), np.float32)
            C = np.zeros((16, 8), np.float32)
            for lane in range(WARP):
                g, t = lane // 4, lane % 4
                th = w * WARP + lane
                A[g, 2 * t : 2 * t + 2] = a[th, 0]
                A[g + 8, 2 * t : 2 * t + 2] = a[th, 1]
                A[g, 2 * t + 8 : 2 * t + 10] = a[th, 2]
                A[g + 8, 2 * t + 8 : 2 * t + 10] = a[th, 3]
                B[2 * t : 2 * t + 2, g] = b[th, 0]
                B[2 * t + 8 : 2 * t + 10, g] = b[th, 1]
                C[g, 2 * t : 2 * t + 2] = c[th, 0]
                C[g + 8, 2 * t : 2 * t + 2] = c[th, 1]
            D = A @ B + C
            for lane in range(WARP):
                g, t = lane // 4, lane % 4
                d[w * WARP + lane, 0] = D[g, 2 * t : 2 * t + 2]
                d[w * WARP + lane, 1] = D[g + 8, 2 * t : 2 * t + 2]
        self.env[res[0]] = d


def run_kernel(func: ir.Operation, grid: tuple[int, int, int], threads: int, bindings: list[np.ndarray],
               first: str = "else") -> None:  # fmt: skip
    """Run ``func`` (the kernel's ``func.func``) over ``grid``; ``bindings`` in binding order, the last written.

    ``first``: which branch of a role fork runs first until it blocks (``else`` or ``then``)."""
    body = func.regions[0].blocks[0]
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                block = _Block(threads, (x, y, z), dict(enumerate(bindings)), first)
                group = _Group(None)
                for kind, bid, n, k in block.run(body, group):  # no fork: every barrier has every thread
                    assert k == n, f"barrier {bid} ({kind}) reached by {k} of its {n} threads"
                assert not group.open and not group.committed, "the kernel ended with cp.async copies in flight"


def _workgroup(export: ir.Operation) -> tuple[tuple[int, int, int], int]:
    """The grid (the export's ``count`` region: constants) and the threads of a workgroup."""
    consts, grid = {}, None
    for op in export.regions[0].blocks[0].operations:
        if op.operation.name == "arith.constant":
            consts[op.result] = _attr_int(op.operation.attributes["value"])
        elif op.operation.name == "hal.return":
            grid = tuple(consts[v] for v in op.operation.operands)
    threads = [_attr_int(a) for a in ir.ArrayAttr(export.attributes["workgroup_size"])]
    return grid, threads[0] * threads[1] * threads[2]


_UNSIGNED = {6, 7, 8, 9}  # ult, ule, ugt, uge: compared as unsigned (a negative index is huge)


def _body_op(o: ir.Operation, env: dict, grid: np.ndarray) -> None:
    """One op of a ``linalg.generic`` body, on arrays over the whole iteration space."""
    name, a = o.name, [env[v] for v in o.operands]
    if name == "linalg.index":
        out = grid[_attr_int(o.attributes["dim"])]
    elif name == "tensor.extract":
        out = a[0][tuple(np.asarray(i, np.int64) for i in a[1:])]
    elif name == "arith.cmpi":
        pred = _attr_int(o.attributes["predicate"])
        x, y = (np.asarray(v, np.int64) for v in a)
        if pred in _UNSIGNED:
            x, y = x.astype(np.uint64), y.astype(np.uint64)
        out = [np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal, np.less,
               np.less_equal, np.greater, np.greater_equal][pred](x, y)  # fmt: skip
    elif name == "arith.select":
        out = np.where(a[0], a[1], a[2])
    elif name == "arith.constant":
        attr = o.attributes["value"]
        out = ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else ir.FloatAttr(attr).value
    else:
        ops = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply, "arith.andi": np.bitwise_and,
               "arith.ori": np.bitwise_or, "arith.divui": np.floor_divide, "arith.remui": np.remainder,
               "arith.addf": np.add, "arith.mulf": np.multiply, "arith.subf": np.subtract,
               "arith.truncf": lambda v: np.asarray(v).astype(_float(o.results[0].type)),
               "arith.extf": lambda v: np.asarray(v).astype(np.float32)}  # fmt: skip
        if name not in ops:
            raise NotImplementedError(f"emulator: linalg.generic body op {name}")
        out = ops[name](*a)
    env[o.results[0]] = out


def _generic(op: ir.Operation, env: dict) -> np.ndarray:
    """``linalg.generic`` over its whole iteration space at once (any affine maps, ``linalg.index`` and
    ``tensor.extract`` in the body); a reduction's body must add to its accumulator, summed by index."""
    seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    ins, outs = list(op.operands)[: seg[0]], list(op.operands)[seg[0] :]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    reduction = any("reduction" in str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"]))
    extent: dict[int, int] = {}
    for v, m in zip(ins + outs, maps):
        for e, size in zip(m.results, np.shape(env[v])):
            if re.fullmatch(r"d\d+", str(e)):
                extent[int(str(e)[1:])] = size
    loops = maps[0].n_dims
    assert set(extent) == set(range(loops)), f"loops without an extent: {set(range(loops)) - set(extent)}"
    grid = np.indices([extent[d] for d in range(loops)], np.int64)
    names = {f"d{d}": grid[d] for d in range(loops)}

    def where(m) -> tuple[np.ndarray, ...]:
        return tuple(np.broadcast_to(eval(str(e).replace("floordiv", "//").replace("mod", "%"), {}, names),
                                     grid.shape[1:]) for e in m.results)  # fmt: skip

    body = op.regions[0].blocks[0]
    local = dict(env)
    for arg, v, m in zip(body.arguments, ins, maps):
        local[arg] = np.asarray(env[v])[where(m)]
    init, at = np.asarray(env[outs[0]]), where(maps[-1])
    local[body.arguments[len(ins)]] = np.zeros(grid.shape[1:], init.dtype) if reduction else init[at]
    for inner in body.operations:
        o = inner.operation
        if o.name == "linalg.yield":
            yielded, value = o.operands[0], local[o.operands[0]]
            break
        _body_op(o, local, grid)
    out = np.array(init, copy=True)
    if reduction:  # the body is acc + f(ins): f summed into each output entry
        add = yielded.owner
        assert add.name == "arith.addf" and body.arguments[len(ins)] in list(add.operands), f"not a sum: {add}"
        np.add.at(out, at, value.astype(out.dtype))
    else:
        out[at] = value
    return out


def run_module(module: ir.Module, args: list[np.ndarray], first: str = "else") -> np.ndarray:
    """Run the module's top-level function on ``args``: its own tensor ops (reshapes, fills, the
    ``linalg.generic`` of a split's stage 2) in numpy, each ``flow.dispatch`` by :func:`run_kernel`
    (workgroups in order; a result not tied to an operand starts as NaN). Returns the function's result."""
    assert module.operation.verify()  # IREE would refuse what does not verify
    top = [op for op in module.body.operations if op.operation.name == "func.func"]
    executables = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations
                   if op.operation.name == "hal.executable.source"}  # fmt: skip
    (fn,) = top
    body = fn.regions[0].blocks[0]
    env = {a: np.asarray(v) for a, v in zip(body.arguments, args)}
    for op in body.operations:
        o = op.operation
        name, res = o.name, list(o.results)
        if name in ("tensor.collapse_shape", "tensor.expand_shape"):
            env[res[0]] = np.asarray(env[o.operands[0]]).reshape(ir.RankedTensorType(res[0].type).shape)
        elif name == "tensor.empty":
            t = ir.RankedTensorType(res[0].type)
            dtype = np.int32 if isinstance(t.element_type, ir.IntegerType) else np.float32
            env[res[0]] = np.full(t.shape, np.nan if dtype == np.float32 else 0, dtype)
        elif name == "arith.constant":
            attr = o.attributes["value"]
            env[res[0]] = ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else ir.FloatAttr(attr).value
        elif name == "linalg.fill":
            env[res[0]] = np.full_like(env[o.operands[1]], env[o.operands[0]])
        elif name == "linalg.generic":
            env[res[0]] = _generic(o, env)
        elif name == "linalg.transpose":  # result dimension i is source dimension permutation[i]
            perm = list(ir.DenseI64ArrayAttr(o.attributes["permutation"]))
            env[res[0]] = np.ascontiguousarray(np.transpose(env[o.operands[0]], perm))
        elif name == "util.optimization_barrier":
            for r, v in zip(res, o.operands):
                env[r] = env[v]
        elif name == "flow.dispatch":
            exe = executables[re.match(r"\[@\"?([\w.]+)", str(o.attributes["entry_points"])).group(1)]
            (export,) = [e for e in exe.regions[0].blocks[0].operations if e.operation.name == "hal.executable.export"]
            (kernel,) = [f for f in collect_funcs(exe)]
            grid, threads = _workgroup(export.operation)
            tied = [ir.IntegerAttr(a).value for a in ir.ArrayAttr(o.attributes["tied_operands"])] if (
                "tied_operands" in o.attributes) else [-1] * len(res)  # fmt: skip
            operands = [np.array(env[v], copy=True) for v in o.operands]
            fresh = [np.full(ir.RankedTensorType(r.type).shape, np.nan, _float(r.type))
                     for r, t in zip(res, tied) if t < 0]  # fmt: skip
            subspans = [s for s in _walk(kernel) if s.name == "hal.interface.binding.subspan"]
            bindings = operands + fresh
            views = [b.reshape(ir.MemRefType(s.results[0].type).shape) for b, s in zip(bindings, subspans)]
            run_kernel(kernel, grid, threads, views, first)
            it = iter(fresh)
            for r, t in zip(res, tied):
                env[r] = operands[t] if t >= 0 else next(it)
        elif name == "func.return":
            return env[o.operands[0]]
        else:
            raise NotImplementedError(f"emulator: top-level op {name}")
    raise AssertionError("no func.return")


def _walk(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


def collect_funcs(exe: ir.Operation) -> list[ir.Operation]:
    """The kernel functions of an executable (``func.func`` with a ``translation_info``)."""
    return [o for o in _walk(exe) if o.name == "func.func" and "translation_info" in o.attributes]


def module_error(problem, plan, passes, seed: int) -> float:
    """Max error of ``problem``'s module, built for ``plan`` and rewritten by ``passes`` (pass instances), run
    by :func:`run_module` on random inputs, against float64, relative to the largest entry of dW."""
    from convbw_mlir.dialects import convbw

    from convbw_mlir.epilogues import random_d
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.reference import random_inputs, reference

    x, dy = random_inputs(problem, seed=seed)
    d = random_d(problem, seed=seed + 1)  # the epilogue's D, where it reads one
    with new_context():
        module = convbw.build_module(problem, plan)
        for p in passes:
            p.run(module.operation)
        got = run_module(module, [x, dy] if d is None else [x, dy, d]).astype(np.float64)
    exact = reference(problem, x, dy, d)
    return float(np.abs(got - exact).max() / np.abs(exact).max())
