"""A numpy emulator of the explicit sm_80 kernel's IR (no GPU here): every thread of a workgroup at once.

It interprets the ops ``convbw_mlir.kernels.gemm_sm80`` emits (arith, gpu, memref, vector, scf, nvvm's
cp.async groups, and nvgpu's ``device_async_copy``, ``ldmatrix`` and ``mma.sync`` with the PTX ISA's
fragment layouts), one value an array over the workgroup's threads, so that the kernel's numerics
(addresses, zero-fill, fragment wiring, masks) are checked on the CPU against a float64 reference.
Copies complete at once (no asynchrony: races are not modelled; the GPU run checks those).
"""

from __future__ import annotations

import numpy as np

from convbw_mlir.ir_imports import ir

WARP = 32


def _attr_int(a: ir.Attribute) -> int:
    return ir.IntegerAttr(a).value


class _Block:
    """One workgroup: ``threads`` lanes, its block ids, its shared allocations."""

    def __init__(self, threads: int, block_id: tuple[int, int, int], bindings: dict[int, np.ndarray]) -> None:
        self.t = threads
        self.tid = np.arange(threads, dtype=np.int64)
        self.block_id = block_id
        self.bindings = bindings
        self.env: dict[ir.Value, object] = {}

    def get(self, v: ir.Value):
        return self.env[v]

    def idx(self, v: ir.Value) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.env[v], dtype=np.int64), (self.t,))

    def run(self, block: ir.Block, mask: np.ndarray | None = None) -> list:
        for op in block.operations:
            out = self.step(op.operation, mask)
            if op.operation.name in ("scf.yield",):
                return out
        return []

    def step(self, op: ir.Operation, mask: np.ndarray | None):  # noqa: C901 - one branch an op
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
                  "arith.maxsi": np.maximum, "arith.andi": np.logical_and}  # fmt: skip
        if name in binary:
            a, b = self.get(ins[0]), self.get(ins[1])
            self.env[res[0]] = binary[name](a, b)
            return None
        if name == "arith.cmpi":
            pred = _attr_int(op.attributes["predicate"])
            a, b = self.get(ins[0]), self.get(ins[1])
            self.env[res[0]] = {2: np.less, 0: np.equal, 1: np.not_equal, 3: np.less_equal, 4: np.greater,
                                5: np.greater_equal}[pred](a, b)  # fmt: skip
            return None
        if name == "arith.select":
            c, a, b = (self.get(v) for v in ins)
            c = np.asarray(c)
            if np.ndim(a) > 1 or np.ndim(b) > 1:
                c = c.reshape(c.shape + (1,) * (max(np.ndim(a), np.ndim(b)) - c.ndim))
            self.env[res[0]] = np.where(c, a, b)
            return None
        if name == "arith.truncf":
            self.env[res[0]] = np.asarray(self.get(ins[0])).astype(np.float16)
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
            self.env[res[0]] = np.full(mt.shape, np.nan, np.float16)  # uninitialised: NaN shows a stray read
            return None
        if name in ("gpu.barrier", "nvvm.cp.async.commit.group", "nvvm.cp.async.wait.group"):
            return None
        if name == "nvgpu.device_async_copy":
            return self._async_copy(op, ins, res)
        if name == "memref.load":
            mem = self.get(ins[0])
            self.env[res[0]] = mem[tuple(self.idx(v) for v in ins[1:])]
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
            return self._ldmatrix(op, ins, res)
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
                carried = self.run(body, mask)
            for r, v in zip(res, carried):
                self.env[r] = v
            return None
        if name == "scf.yield":
            return [self.get(v) for v in ins]
        if name == "scf.if":
            cond = np.broadcast_to(np.asarray(self.get(ins[0]), bool), (self.t,))
            self.run(op.regions[0].blocks[0], cond if mask is None else cond & mask)
            return None
        if name == "func.return":
            return None
        raise NotImplementedError(f"emulator: op {name}")

    def _async_copy(self, op, ins, res):
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        dst = self.get(ins[0])
        dst_idx = [self.idx(v) for v in ins[1 : 1 + seg[1]]]
        src = self.get(ins[1 + seg[1]])
        at = 2 + seg[1]
        src_idx = [self.idx(v) for v in ins[at : at + seg[3]]]
        n = _attr_int(op.attributes["dstElements"])
        count = self.idx(ins[at + seg[3]]) if seg[4] else np.full(self.t, n)
        for th in range(self.t):
            s = tuple(i[th] for i in src_idx)
            d = tuple(i[th] for i in dst_idx)
            vals = np.zeros(n, np.float16)
            k = int(count[th])
            if k:
                assert s[-1] + k <= src.shape[-1], f"copy past the row: {s} + {k} of {src.shape}"
                vals[:k] = src[s[:-1]][s[-1] : s[-1] + k]
            dst[d[:-1]][d[-1] : d[-1] + n] = vals
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

    def _ldmatrix(self, op, ins, res):
        smem = self.get(ins[0])
        idx = [self.idx(v) for v in ins[1:]]
        tiles = _attr_int(op.attributes["numTiles"])
        trans = ir.BoolAttr(op.attributes["transpose"]).value
        rows = np.stack([smem[tuple(i[th] for i in idx[:-1])][idx[-1][th] : idx[-1][th] + 8]
                         for th in range(self.t)])  # fmt: skip  # [T, 8]: each lane's row address
        out = np.zeros((self.t, tiles, 2), np.float16)
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


def run_kernel(func: ir.Operation, grid: tuple[int, int, int], threads: int, bindings: list[np.ndarray]) -> None:
    """Run ``func`` (the kernel's ``func.func``) over ``grid``; ``bindings`` in binding order, the last written."""
    body = func.regions[0].blocks[0]
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                _Block(threads, (x, y, z), dict(enumerate(bindings))).run(body)
