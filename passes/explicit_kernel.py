"""convbw-explicit-kernel: replace each op whose plan says ``explicit`` by a kernel our builders write.

    %dw = convbw.conv_bwd_weight(%x, %dy) {plan = {strategy = "explicit", tile = {m = 128, n = 256, ...}}}
  ->
    hal.executable.source private @convbw_explicit_0 {
      hal.executable.export @gemm ... count(%device) { hal.return %n_tiles, %m_tiles, %groups }
      builtin.module { func.func @gemm() {translation_info = <no_pipeline workgroup_size = [256, 1, 1]>} {
        hal.interface.binding.subspan ...; cp.async / ldmatrix / mma.sync pipeline; stores } }
    }
    %x2 = tensor.collapse_shape %x      N x G x C x (H*W)
    %d2 = tensor.collapse_shape %dy     N x G x K x (H*W)
    %w = flow.dispatch @convbw_explicit_0::@gemm(%d2, %x2) : (...) -> G x K x C
    %dw = tensor.expand_shape %w        G x K x C x 1 x 1

Layout 2 (NHWGC/GKYXC/NHWGK): dy collapses to ``(N*Ho*Wo) x G x K``, x to ``(N*H*W) x G x C`` for a
plain 1x1 (else it is bound as it is, ``N x H x W x G x C``), and the result ``G x K x (Y*X*C)`` expands
into GKYXC.

A depthwise plan (``plan.depthwise``) binds dy as ``N x *out x (G*K)`` and x as ``N x *in x (G*C)`` (C = K = 1
for depthwise, at most 16 for thin groups); its kernel (``convbw_mlir.kernels.depthwise_sm80``) writes f32
partials ``chunks x G x K x (taps*C)`` that the same stage-2 sum as split-K's adds up and rounds to dW's type.

A GEMV plan (``plan.gemv``: K or C small) binds dy as ``(N * prod(out)) x (G*K)`` and x flat, ``N * prod(in) * G*C``;
its kernel (``convbw_mlir.kernels.gemv_sm80``) writes f32 partials ``chunks x G x K x (taps*C)``, summed likewise
(one chunk: dW itself, ``G x K x (taps*C)``).

An sm_90a plan (``policies.sm90.is_sm90``: a wgmma tile) binds dy as ``(N*Ho*Wo) x (G*K)``, x as ``N x H x W x
(G*C)`` (1-D: ``N x W x (G*C)``, 3-D: ``N x D x H x W x (G*C)``) and a 256-byte maps buffer (a ``tensor.empty``:
the direct launch binds its own, holding the two CUtensorMaps it encodes); its kernel
(``convbw_mlir.kernels.conv_sm90``) writes dW ``G x K x (Y*X*C)`` or f32 partials that the same stage 2 adds up,
or (``plan.streamk``) runs StreamK on a persistent grid with its workspace (f32 partials, flags zeroed by a fill)
tied through the dispatch. The entry function's ``iree.reflection`` then says so (:data:`TENSOR_MAPS_KEY`), so
IREE's runtime refuses the module (it cannot encode tensor maps).
A wgmma plan with ``plan.merge`` (the boxed form: m groups of C < 64 channels a 64-channel box) binds the same and
writes the same dW; its kernel stores the block diagonal of each box's GEMM.
A merged plan (``plan.merge``: m groups a GEMM, thin groups in layout 2) binds dy as ``(N*Ho*Wo) x (G/m) x (m*K)``
and x as ``N x H x W x (G/m) x (m*C)`` (the same memory: m groups are adjacent channels); its kernel writes dW's
own ``G x K x (Y*X*C)`` (or the split partials), the block diagonal of each merged GEMM
(``convbw_mlir.kernels.gemm_sm80.build_merged_kernel_body``).

IREE compiles the dispatch as written (``#iree_codegen.no_pipeline``): the kernel is the one
``convbw_mlir.kernels.gemm_sm80`` builds from the plan's tile; nothing here decides anything. It runs
right after ``convbw-plan``, so the later passes never see the op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, register

from convbw_mlir.builders import PARALLEL, REDUCTION, generic, pad_zeros, reassociation, zero
from convbw_mlir.ir_imports import arith_d, element_type, ir, linalg_d, tensor_d
from convbw_mlir.plan import PlanError, Strategy, check_plan, computed_problem, explicit_tiling
from convbw_mlir.runtime import TENSOR_MAPS_KEY

__all__ = ["KINDS", "TENSOR_MAPS_KEY", "ExplicitKernel", "Kind", "carried_plan"]

ENTRY = "gemm"
# The plan an explicit kernel carried out rides on its flow.dispatch (no contraction records it).
PLAN_ATTR = "convbw.plan"


def carried_plan(module: ir.Module):  # -> convbw_mlir.plan.Plan | None
    """The plan of the first explicit kernel's dispatch in ``module``, or None."""
    from convbw_mlir.dialects.convbw import dict_from_attr

    from convbw_mlir.plan import Plan

    for op in collect_ops(module.operation, "flow.dispatch"):
        if PLAN_ATTR in op.attributes:
            return Plan.from_dict(dict_from_attr(op.attributes[PLAN_ATTR]))
    return None


def _collapse_spatial(value: ir.Value, rank: int) -> ir.Value:
    """``[N, G, R, *spatial] -> [N, G, R, prod(spatial)]`` (layout 4's spatial dims are innermost)."""
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    flat = 1
    for s in shape[3:]:
        flat *= s
    groups = reassociation([[0], [1], [2], list(range(3, 3 + rank))])
    return tensor_d.CollapseShapeOp(ir.RankedTensorType.get([*shape[:3], flat], t.element_type), value, groups).result


def _collapse_reduction(value: ir.Value, rank: int) -> ir.Value:
    """``[N, *spatial, G, R] -> [N * prod(spatial), G, R]`` (layout 2: the reduction is outermost)."""
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    flat = 1
    for s in shape[: 1 + rank]:
        flat *= s
    groups = reassociation([list(range(1 + rank)), [1 + rank], [2 + rank]])
    return tensor_d.CollapseShapeOp(ir.RankedTensorType.get([flat, *shape[1 + rank :]], t.element_type), value,
                                    groups).result  # fmt: skip


def _sum_splits(
    partials: ir.Value, out: ir.Type, epilogue=None, d: ir.Value | None = None, *, units: int = 0
) -> ir.Value:
    """``[splits, G, M, N]`` f32 partial sums -> ``[G, M, N]`` in dW's type (a reduction IREE compiles itself, in
    split order from +0); the problem's ``epilogue`` (``alpha * sum + beta * D``, D ``[G, M, N]``) in the rounding
    generic, in f32. Given the SMs of an NVIDIA target (``units``), the sum takes our workgroup tile where IREE's
    own is scalar (``policies.split.sum_tile``): the same generic on the flat ``[splits, G*M*N]``, as IREE's
    dispatch has it."""
    from convbw_mlir.policies.split import sum_tile

    shape = list(ir.RankedTensorType(partials.type).shape)
    f32 = ir.F32Type.get()
    tile = sum_tile(math.prod(shape[1:]), units) if units else None
    if tile is None:
        init = linalg_d.fill(zero(f32), outs=[tensor_d.EmptyOp(shape[1:], f32).result])
        dims = [ir.AffineDimExpr.get(i) for i in range(4)]
        maps = [ir.AffineMap.get(4, 0, dims), ir.AffineMap.get(4, 0, dims[1:])]

        @generic([partials], [init], maps, [REDUCTION, PARALLEL, PARALLEL, PARALLEL])
        def total(p: ir.Value, acc: ir.Value) -> ir.Value:
            return arith_d.addf(p, acc)

        return _finish(total, out, epilogue, d)
    return _finish(_flat_sum(partials, tile), out, epilogue, d)


def _flat_sum(partials: ir.Value, tile: tuple[int, int]) -> ir.Value:
    """``[splits, G, M, N]`` f32 -> ``[G, M, N]``: the sum over ``[outputs, splits]`` (outputs parallel, the splits
    unrolled in order) with ``tile`` (threads, elements a thread) as its IREE compilation info."""
    shape = list(ir.RankedTensorType(partials.type).shape)
    splits, outputs = shape[0], math.prod(shape[1:])
    f32 = ir.F32Type.get()
    flat = tensor_d.CollapseShapeOp(ir.RankedTensorType.get([splits, outputs], f32), partials,
                                    reassociation([[0], [1, 2, 3]])).result  # fmt: skip
    init = linalg_d.fill(zero(f32), outs=[tensor_d.EmptyOp([outputs], f32).result])
    o, s = ir.AffineDimExpr.get(0), ir.AffineDimExpr.get(1)
    maps = [ir.AffineMap.get(2, 0, [s, o]), ir.AffineMap.get(2, 0, [o])]

    @generic([flat], [init], maps, [PARALLEL, REDUCTION])
    def total(p: ir.Value, acc: ir.Value) -> ir.Value:
        return arith_d.addf(p, acc)

    threads, width = tile
    total.owner.attributes["compilation_info"] = ir.Attribute.parse(
        "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        f"workgroup = [{threads * width}, 0], thread = [{width}, 0], reduction = [0, {splits}]}}>, "
        "translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
        f"workgroup_size = [{threads}, 1, 1] subgroup_size = 32>>"
    )
    return tensor_d.ExpandShapeOp(ir.RankedTensorType.get(shape[1:], f32), total, reassociation([[0, 1, 2]]), [],
                                  shape[1:]).result  # fmt: skip


def _split_units(plan) -> int:
    """The SMs a split-K plan's sum takes its own tile for (``policies.split.sum_tile``): NVIDIA's; 0 (IREE's tile)
    on AMD (not diagnosed there). The GEMV and depthwise kernels' chunks (up to hundreds over few outputs) keep
    IREE's: the tile was not made for them (the depthwise kernel has a stage 2 of its own)."""
    return plan.target_info.compute_units if plan.target_info.family == "nvidia" else 0


def _finish(total: ir.Value, out: ir.Type, epilogue=None, d: ir.Value | None = None) -> ir.Value:
    """``[G, M, N]`` f32 sums -> dW's type, with the problem's ``epilogue`` (``alpha * sum + beta * D``) in f32."""
    shape = list(ir.RankedTensorType(total.type).shape)
    f32 = ir.F32Type.get()
    if out == f32 and epilogue is None:
        return total
    ins = [total] if d is None else [total, d]
    ident = ir.AffineMap.get_identity(3)

    @generic(ins, [tensor_d.EmptyOp(shape, out).result], [ident] * (len(ins) + 1), [PARALLEL] * 3)
    def rounded(v: ir.Value, *rest: ir.Value) -> ir.Value:
        if epilogue is not None:
            if epilogue.alpha != 1.0:
                v = arith_d.mulf(v, arith_d.constant(f32, epilogue.alpha))
            if d is not None:
                dv = rest[0] if rest[0].type == f32 else arith_d.extf(f32, rest[0])
                if epilogue.beta != 1.0:
                    dv = arith_d.mulf(dv, arith_d.constant(f32, epilogue.beta))
                v = arith_d.addf(v, dv)
        return v if out == f32 else arith_d.truncf(out, v)

    return rounded


def _merge_channels(value: ir.Value) -> ir.Value:
    """``[N, *spatial, G, C] -> [N, *spatial, G*C]`` (the depthwise kernel's operands: C = 1, or thin groups)."""
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    groups = reassociation([[i] for i in range(len(shape) - 2)] + [[len(shape) - 2, len(shape) - 1]])
    merged = [*shape[:-2], shape[-2] * shape[-1]]
    return tensor_d.CollapseShapeOp(ir.RankedTensorType.get(merged, t.element_type), value, groups).result


def _depthwise_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The depthwise kernel's dispatch on ``op``'s operands and its stage 2: dW in its own shape."""
    from convbw_mlir.kernels import depthwise_sm80
    from convbw_mlir.kernels.entry import KernelEntry, build_dispatch
    from convbw_mlir.policies.depthwise import kernel

    k = kernel(problem, plan.depthwise)
    f16, f32 = element_type(problem.dtype), ir.F32Type.get()
    x, dy = _merge_channels(op.operands[0]), _merge_channels(op.operands[1])
    ws_shape = [k.chunks, problem.groups, problem.out_channels, k.conv.taps * problem.in_channels]
    entry = KernelEntry(
        executable=name,
        function=ENTRY,
        grid=depthwise_sm80.grid(k),
        workgroup_size=(k.launched, 1, 1),
        subgroup_size=plan.target_info.subgroup_size,
        bindings=(
            ir.MemRefType.get(list(ir.RankedTensorType(dy.type).shape), f16),
            ir.MemRefType.get(list(ir.RankedTensorType(x.type).shape), f16),
            ir.MemRefType.get(ws_shape, f32),
        ),
    )
    body = partial(_depthwise_body, k=k)
    with ir.Location.unknown():
        partials = build_dispatch(entry, body, [dy, x], ir.RankedTensorType.get(ws_shape, f32), top)
    partials.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    if not depthwise_sm80_stage2():
        return _sum_splits(partials, element_type(problem.dw_dtype))
    return _depthwise_sum(partials, element_type(problem.dw_dtype), plan, name, top)


def depthwise_sm80_stage2() -> bool:
    """Whether the depthwise kernel's chunks are summed by its own stage 2 (the policy's switch)."""
    from convbw_mlir.policies import depthwise

    return depthwise.OWN_STAGE2


def _depthwise_sum(partials: ir.Value, out: ir.Type, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The depthwise kernel's chunks ``[chunks, G, K, T*C]`` f32 summed by its own stage 2
    (``depthwise_sm80.build_sum_body``) into ``[G, K, T*C]`` of dW's type."""
    from convbw_mlir.kernels import depthwise_sm80
    from convbw_mlir.kernels.entry import KernelEntry, build_dispatch

    shape = list(ir.RankedTensorType(partials.type).shape)
    outputs = math.prod(shape[1:])
    f32 = ir.F32Type.get()
    flat = tensor_d.CollapseShapeOp(ir.RankedTensorType.get([shape[0], outputs], f32), partials,
                                    reassociation([[0], [1, 2, 3]])).result  # fmt: skip
    entry = KernelEntry(
        executable=f"{name}_sum",
        function="depthwise_sum",  # IREE links the executables into one module: a name of its own
        grid=depthwise_sm80.sum_grid(outputs),
        workgroup_size=(depthwise_sm80.SUM_THREADS, 1, 1),
        subgroup_size=plan.target_info.subgroup_size,
        bindings=(ir.MemRefType.get([shape[0], outputs], f32), ir.MemRefType.get([outputs], out)),
    )
    with ir.Location.unknown():
        summed = build_dispatch(entry, lambda blk, mems: depthwise_sm80.build_sum_body(blk, *mems, shape[0], outputs),
                                [flat], ir.RankedTensorType.get([outputs], out), top)  # fmt: skip
    return tensor_d.ExpandShapeOp(ir.RankedTensorType.get(shape[1:], out), summed, reassociation([[0, 1, 2]]), [],
                                  shape[1:]).result  # fmt: skip


def _depthwise_body(block: ir.Block, memrefs: list[ir.Value], k) -> None:
    from convbw_mlir.kernels import depthwise_sm80

    depthwise_sm80.build_kernel_body(block, *memrefs, k)


def _gemv_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The split-reduction GEMV kernel's dispatch on ``op``'s operands and its stage 2: dW as ``[G, K, taps * C]``."""
    from convbw_mlir.kernels import gemv_sm80
    from convbw_mlir.kernels.entry import KernelEntry, build_dispatch
    from convbw_mlir.policies.gemv import kernel

    k = kernel(problem, plan.gemv)
    f16, ws_t = element_type(problem.dtype), ir.F32Type.get()
    x_shape = list(ir.RankedTensorType(op.operands[0].type).shape)  # flat: the kernel adds each tap's offset
    x_t = ir.RankedTensorType.get([math.prod(x_shape)], f16)
    x = tensor_d.CollapseShapeOp(x_t, op.operands[0], reassociation([list(range(len(x_shape)))])).result
    flat = reassociation([list(range(problem.rank + 1)), [problem.rank + 1, problem.rank + 2]])
    dy_shape = list(ir.RankedTensorType(op.operands[1].type).shape)
    dy_t = ir.RankedTensorType.get([math.prod(dy_shape[: problem.rank + 1]), math.prod(dy_shape[problem.rank + 1 :])],
                                   f16)  # fmt: skip
    dy = tensor_d.CollapseShapeOp(dy_t, op.operands[1], flat).result
    ws_shape = [k.chunks, problem.groups, problem.out_channels, k.filter_taps * problem.in_channels]
    out = element_type(problem.dw_dtype)
    if k.direct:  # one chunk: the kernel writes dW in its type, no second stage
        ws_shape, ws_t = ws_shape[1:], out
    entry = KernelEntry(
        executable=name,
        function=ENTRY,
        grid=gemv_sm80.grid(k),
        workgroup_size=(k.threads, 1, 1),
        subgroup_size=plan.target_info.subgroup_size,
        bindings=(
            ir.MemRefType.get(list(dy_t.shape), f16),
            ir.MemRefType.get(list(ir.RankedTensorType(x.type).shape), f16),
            ir.MemRefType.get(ws_shape, ws_t),
        ),
    )
    with ir.Location.unknown():
        partials = build_dispatch(entry, partial(_gemv_body, k=k), [dy, x], ir.RankedTensorType.get(ws_shape, ws_t),
                                  top)  # fmt: skip
    partials.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    return partials if k.direct else _sum_splits(partials, out)


def _gemv_body(block: ir.Block, memrefs: list[ir.Value], k) -> None:
    from convbw_mlir.kernels import gemv_sm80

    gemv_sm80.build_kernel_body(block, *memrefs, k)


def _sm90_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The sm_90a kernel's dispatch on ``op``'s operands (and its stage 2): dW as ``G x K x (Y*X*C)``."""
    from convbw_mlir.kernels.conv_sm90 import build_conv_body, build_streamk_dispatch, conv_entry, from_problem
    from convbw_mlir.kernels.entry import build_dispatch
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling
    from convbw_mlir.policies import sm90

    t, rank = plan.tile, problem.rank
    sk, merge = plan.streamk.workgroups if plan.streamk else 0, plan.merge.groups if plan.merge else 0
    g = from_problem(problem, Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages), plan.k_batch, sk, merge)
    out, ep = element_type(problem.dw_dtype), problem.epilogue
    # an epilogue rides the second pass: the split's sum, or (unsplit) one pass from the kernel's f32 result
    entry = conv_entry(g, element_type(problem.dtype), out if ep is None else ir.F32Type.get(), name)
    # dy [N, *out, G, K] -> [N * prod(out), G K]; x [N, *spatial, G, C] -> [N, *spatial, G C]
    flat = reassociation([list(range(rank + 1)), [rank + 1, rank + 2]])
    dy_t = ir.RankedTensorType.get(ir.MemRefType(entry.bindings[0]).shape, element_type(problem.dtype))
    dy = tensor_d.CollapseShapeOp(dy_t, op.operands[1], flat).result
    x_t = ir.RankedTensorType.get(ir.MemRefType(entry.bindings[1]).shape, element_type(problem.dtype))
    x_flat = reassociation([[i] for i in range(rank + 1)] + [[rank + 1, rank + 2]])
    x = tensor_d.CollapseShapeOp(x_t, op.operands[0], x_flat).result
    maps = tensor_d.EmptyOp([sm90.MAPS_BYTES], ir.IntegerType.get_signless(8)).result
    # not a constant to IREE: a hoisted global buffer (what a split module made of it) is no binding the schedule
    # reader takes; a per-call one is the transient's, which the launcher rebinds to its maps
    maps = ir.Operation.create("util.optimization_barrier", results=[maps.type], operands=[maps]).result
    c = ir.MemRefType(entry.bindings[-1])
    with ir.Location.unknown():
        if g.streamk:  # its workspace (partials, zeroed flags) tied through the dispatch
            result = build_streamk_dispatch(g, entry, [dy, x, maps], top)
            result.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
            return result
        result = build_dispatch(entry, lambda blk, mems: build_conv_body(blk, mems, g), [dy, x, maps],
                                   ir.RankedTensorType.get(c.shape, c.element_type), top)  # fmt: skip
    result.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    d = None
    if ep is not None and ep.reads_d:  # D in dW's order, [G, K, Y X C]
        d_t = ir.RankedTensorType(op.operands[2].type)
        groups = reassociation([[0], [1], [2, *range(3, 3 + rank)]])
        d_shape = [problem.groups, problem.out_channels, math.prod(d_t.shape[2:])]
        d = tensor_d.CollapseShapeOp(ir.RankedTensorType.get(d_shape, d_t.element_type), op.operands[2], groups).result
    if plan.k_batch > 1:
        return _sum_splits(result, out, ep, d, units=_split_units(plan))
    return result if ep is None else _finish(result, out, ep, d)


def _k_major(value: ir.Value, stride: tuple[int, ...], rows: int) -> ir.Value:
    """A channels-last fp8 operand ``[N, *spatial, (G = 1,) ch]`` as the K-major copy an fp8 recipe's quantize
    step writes: every ``stride``-th position (x of a strided 1x1), flattened to ``[R, ch]``, zero rows to
    ``rows``, transposed to ``[ch, rows]`` (one dispatch IREE compiles: a slice, a pad and a transpose)."""
    t = ir.RankedTensorType(value.type)
    shape, rank = list(t.shape), len(stride)
    if any(s > 1 for s in stride):
        sizes = [shape[0], *(-(-d // s) for d, s in zip(shape[1 : 1 + rank], stride)), *shape[1 + rank :]]
        steps = [1, *stride, *[1] * (len(shape) - 1 - rank)]
        sliced = ir.RankedTensorType.get(sizes, t.element_type)
        value = tensor_d.ExtractSliceOp(sliced, value, [], [], [], [0] * len(shape), sizes, steps).result
        shape = sizes
    flat = math.prod(shape[:-1])
    value = tensor_d.CollapseShapeOp(ir.RankedTensorType.get([flat, shape[-1]], t.element_type), value,
                                     reassociation([list(range(len(shape) - 1)), [len(shape) - 1]])).result  # fmt: skip
    value = pad_zeros(value, [0, 0], [rows - flat, 0])
    init = tensor_d.EmptyOp([shape[-1], rows], t.element_type).result
    return linalg_d.transpose(value, outs=[init], permutation=[1, 0])


def _flat_k_major(value: ir.Value, rows: int) -> ir.Value:
    """A K-major operand ``[ch, N, *spatial]`` as ``[ch, rows]`` (a view; zero columns where R is padded)."""
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    flat = math.prod(shape[1:])
    value = tensor_d.CollapseShapeOp(ir.RankedTensorType.get([shape[0], flat], t.element_type), value,
                                     reassociation([[0], list(range(1, len(shape)))])).result  # fmt: skip
    return pad_zeros(value, [0, 0], [0, rows - flat])


def _fp8_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The fp8 GEMM's dispatch (``convbw_mlir.policies.sm90_fp8``): dy^T and x^T made K-major, the TN GEMM
    ``dW[K, C] = dy^T x`` (times the scale epilogue's alpha), a split's partials summed in split order;
    returns dW ``[K, C]``."""
    from convbw_mlir.kernels.entry import build_dispatch
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, build_gemm_body, gemm_entry
    from convbw_mlir.policies import sm90_fp8

    t, splits = plan.tile, plan.k_batch
    rows = sm90_fp8.padded_reduction(problem, plan)
    tiling = Sm90Tiling(bn=t.n, consumers=t.subgroups_m, stages=t.stages, elem_bytes=1, splits=splits, promote=True)
    out, f32 = element_type(problem.dw_dtype), ir.F32Type.get()
    alpha = problem.epilogue.alpha if problem.epilogue is not None else 1.0
    k, c = problem.out_channels, problem.in_channels
    if problem.layout_family.x.startswith("C"):  # K-major already (problem.K_MAJOR): [ch, N, *spatial] -> [ch, R]
        dy_t, x_t = (_flat_k_major(v, rows) for v in (op.operands[1], op.operands[0]))
    else:
        dy_t = _k_major(op.operands[1], (1,) * problem.rank, rows)
        x_t = _k_major(op.operands[0], tuple(problem.stride), rows)
    entry = gemm_entry(k, c, rows, tiling, element_type(problem.dy_type), out if splits == 1 else f32,
                       element_type(problem.dtype), scales=False, partials=splits > 1, name=name)  # fmt: skip
    maps = tensor_d.EmptyOp([sm90_fp8.MAPS_BYTES], ir.IntegerType.get_signless(8)).result
    # as _sm90_dispatch's: a per-call buffer of the transient (the launcher rebinds it), not a hoisted global
    maps = ir.Operation.create("util.optimization_barrier", results=[maps.type], operands=[maps]).result
    result_mem = ir.MemRefType(entry.bindings[-1])
    with ir.Location.unknown():
        result = build_dispatch(
            entry, lambda blk, mems: build_gemm_body(blk, mems, rows, tiling, alpha if splits == 1 else None),
            [dy_t, x_t, maps], ir.RankedTensorType.get(result_mem.shape, result_mem.element_type), top,
        )  # fmt: skip
    result.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    if splits == 1:
        return result
    partials = tensor_d.ExpandShapeOp(ir.RankedTensorType.get([splits, 1, k, c], f32), result,
                                      reassociation([[0, 1], [2], [3]]), [], [splits, 1, k, c]).result  # fmt: skip
    total = _sum_splits(partials, out, problem.epilogue, units=_split_units(plan))
    return tensor_d.CollapseShapeOp(ir.RankedTensorType.get([k, c], out), total, reassociation([[0, 1], [2]])).result


def _mark_tensor_maps(module: ir.Operation, kernel: str) -> None:
    """Say in the entry function's reflection that its kernel ``kernel`` reads tensor maps the caller encodes."""
    from convbw_mlir.dialects.convbw import FUNC_NAME

    for fn in module.regions[0].blocks[0].operations:
        if "sym_name" in fn.attributes and ir.StringAttr(fn.attributes["sym_name"]).value == FUNC_NAME:
            fn.attributes["iree.reflection"] = ir.DictAttr.get({TENSOR_MAPS_KEY: ir.StringAttr.get(kernel)})


def _regroup(value: ir.Value, merge: int) -> ir.Value:
    """``[..., G, C] -> [..., G / merge, merge * C]``: ``merge`` adjacent groups as one (a view of the same memory)."""
    t = ir.RankedTensorType(value.type)
    *outer, g, c = list(t.shape)
    flat_t = ir.RankedTensorType.get([*outer, g * c], t.element_type)
    lead = [[i] for i in range(len(outer))]
    flat = tensor_d.CollapseShapeOp(flat_t, value, reassociation([*lead, [len(outer), len(outer) + 1]])).result
    shape = [*outer, g // merge, merge * c]
    return tensor_d.ExpandShapeOp(ir.RankedTensorType.get(shape, t.element_type), flat,
                                  reassociation([*lead, [len(outer), len(outer) + 1]]), [], shape).result  # fmt: skip


def _merged_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The merged kernel's dispatch on ``op``'s operands (and a split's stage 2, with the epilogue): dW as
    ``[G, K, taps * C]``."""
    from convbw_mlir.kernels.entry import KernelEntry, build_dispatch
    from convbw_mlir.policies.sm80 import gemm_shape, merged

    m = plan.merge.groups
    shape, t = gemm_shape(merged(problem, m), plan.k_batch), explicit_tiling(plan)
    out, f32 = element_type(problem.dw_dtype), ir.F32Type.get()
    dw_shape = [problem.groups, problem.out_channels, problem.in_channels * (shape.conv.taps if shape.conv else 1)]
    c_shape, c_type = ([shape.splits, *dw_shape], f32) if shape.splits > 1 else (dw_shape, out)
    dy = _collapse_reduction(_regroup(op.operands[1], m), problem.rank)
    x = _regroup(op.operands[0], m)
    if shape.conv is None:  # a plain 1x1: x is read as dy is
        x = _collapse_reduction(x, problem.rank)
    ep = problem.epilogue
    fused = ep is not None and shape.splits == 1  # a split applies it in its sum
    d = None
    if ep is not None and ep.reads_d:  # D in dW's order, [G, K, taps * C]
        d_t = ir.RankedTensorType(op.operands[2].type)
        groups = reassociation([[0], [1], [2, *range(3, 3 + problem.rank)]])
        d = tensor_d.CollapseShapeOp(ir.RankedTensorType.get(dw_shape, d_t.element_type), op.operands[2], groups).result
    operands = [dy, x] if not fused or d is None else [dy, x, d]
    entry = KernelEntry(
        executable=name,
        function=ENTRY,
        grid=_kernel_module("nvidia").grid(shape, t),
        workgroup_size=(t.threads, 1, 1),
        subgroup_size=plan.target_info.subgroup_size,
        bindings=(*(ir.MemRefType.get(list(ir.RankedTensorType(v.type).shape), ir.RankedTensorType(v.type).element_type)
                    for v in operands), ir.MemRefType.get(c_shape, c_type)),
    )  # fmt: skip
    merge = (m, problem.out_channels, problem.in_channels, plan.merge.skip_off_diagonal)
    body = partial(_merged_body, shape=shape, tiling=t, merge=merge, epilogue=ep if fused else None)
    with ir.Location.unknown():
        result = build_dispatch(entry, body, operands, ir.RankedTensorType.get(c_shape, c_type), top)
    result.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    return _sum_splits(result, out, ep, d, units=_split_units(plan)) if shape.splits > 1 else result


def _merged_body(block: ir.Block, memrefs: list[ir.Value], shape, tiling, merge: tuple[int, int, int, bool],
                 epilogue) -> None:  # fmt: skip
    """The merged sm_80 kernel: bindings dy, x, (D,) dW; the epilogue in its store where unsplit."""
    from convbw_mlir.kernels.gemm_sm80 import Fused, Merged, build_merged_kernel_body

    a, b, *d, c = memrefs
    fused = None if epilogue is None else Fused(epilogue.alpha, epilogue.beta, d[0] if d else None)
    build_merged_kernel_body(block, a, b, c, shape, tiling, Merged(*merge), fused)


def _kernel_module(family: str):
    """The builder module of a target family's kernel form."""
    if family == "cdna":
        from convbw_mlir.kernels import gemm_cdna

        return gemm_cdna
    if family == "rdna":
        from convbw_mlir.kernels import gemm_rdna

        return gemm_rdna
    from convbw_mlir.kernels import gemm_sm80

    return gemm_sm80


def _body(block: ir.Block, memrefs: list[ir.Value], shape, tiling, family: str) -> None:
    _kernel_module(family).build_kernel_body(block, *memrefs, shape, tiling)


def _fused_body(block: ir.Block, memrefs: list[ir.Value], shape, tiling, alpha: float, beta: float) -> None:
    """The sm_80 kernel with the epilogue in its store: bindings dy, x, (D,) dW."""
    from convbw_mlir.kernels.gemm_sm80 import Fused, build_kernel_body

    a, b, *d, c = memrefs
    build_kernel_body(block, a, b, c, shape, tiling, Fused(alpha, beta, d[0] if d else None))


def _folded_body(block: ir.Block, memrefs: list[ir.Value], shape, tiling, alpha=None, beta=None) -> None:
    """Layout 4's kernel without a gather: bindings dy, x (spatial flattened), (D,) dW."""
    from convbw_mlir.kernels.gemm_sm80 import Fused, build_folded_kernel_body
    from convbw_mlir.policies.sm80 import folded_window

    a, b, *d, c = memrefs
    fused = None if alpha is None else Fused(alpha, beta, d[0] if d else None)
    build_folded_kernel_body(block, a, b, c, shape, tiling, folded_window(shape, tiling), fused)


def _wavespec_body(block: ir.Block, memrefs: list[ir.Value], shape, tiling, producers: int) -> None:
    from convbw_mlir.kernels import wavespec_sm80

    wavespec_sm80.build_kernel_body(block, *memrefs, shape, tiling, producers)


def _gemm_dispatch(op: ir.Operation, problem, plan, name: str, top: ir.InsertionPoint) -> ir.Value:
    """The implicit-GEMM kernels' dispatch (``convbw_mlir.kernels.gemm_sm80``, its fused, folded, StreamK and
    wave-specialized forms; ``gemm_cdna`` / ``gemm_rdna`` on AMD) and a split's stage 2: dW as ``[G, K, taps * C]``."""
    from convbw_mlir.kernels.entry import KernelEntry, build_dispatch
    from convbw_mlir.policies.sm80 import gemm_shape, wavespec_threads

    shape, t = gemm_shape(problem, plan.k_batch), explicit_tiling(plan)
    family = plan.target_info.family
    kernels = _kernel_module(family)
    f16 = element_type(problem.dtype)
    out = element_type(problem.dw_dtype)
    f32 = ir.F32Type.get()
    a_shape = [shape.images, shape.groups, shape.m, shape.hw]
    b_shape = [shape.images, shape.groups, shape.n, shape.hw]
    if shape.channels_last:
        a_shape = [shape.reduction, shape.groups, shape.m]
        b_shape = [shape.reduction, shape.groups, shape.n]
    if shape.conv is not None:  # gathered from x as it is
        b_shape = list(ir.RankedTensorType(op.operands[0].type).shape)
    if plan.folded:  # x's planes flattened: its windows are runs of the plane
        b_shape = [*b_shape[:3], shape.conv and math.prod(shape.conv.in_size)]
    c_shape = [shape.groups, shape.m, shape.n]
    c_shape, c_type = ([shape.splits, *c_shape], f32) if shape.splits > 1 else (c_shape, out)
    ep = problem.epilogue
    fused = ep is not None and shape.splits == 1  # a split applies it in its sum
    d_type = [ir.MemRefType.get([shape.groups, shape.m, shape.n], element_type(ep.d_dtype))] if (
        fused and ep.reads_d) else []  # fmt: skip
    bindings = (
        ir.MemRefType.get(a_shape, f16),
        ir.MemRefType.get(b_shape, f16),
        *d_type,
        ir.MemRefType.get(c_shape, c_type),
    )
    body, threads = partial(_body, shape=shape, tiling=t, family=family), t.threads
    if fused:  # the epilogue in the kernel's store: kernels/gemm_sm80.py Fused
        body = partial(_fused_body, shape=shape, tiling=t, alpha=ep.alpha, beta=ep.beta)
    if plan.folded:  # layout 4 without a gather: kernels/gemm_sm80.py build_folded_kernel_body
        body = partial(_folded_body, shape=shape, tiling=t)
        if fused:
            body = partial(body, alpha=ep.alpha, beta=ep.beta)
    if plan.wavespec is not None:  # producer warps beside the tiling's: kernels/wavespec_sm80.py
        producers = plan.wavespec.producers
        threads = wavespec_threads(t, producers)
        body = partial(_wavespec_body, shape=shape, tiling=t, producers=producers)
    entry = KernelEntry(
        executable=name,
        function=ENTRY,
        grid=kernels.grid(shape, t),
        workgroup_size=(threads, 1, 1),
        subgroup_size=plan.target_info.subgroup_size,
        bindings=bindings,
    )
    collapse = _collapse_reduction if shape.channels_last else _collapse_spatial
    dy = collapse(op.operands[1], problem.rank)
    x = op.operands[0] if shape.conv is not None and not plan.folded else collapse(op.operands[0], problem.rank)
    groups = reassociation([[0], [1], [2, *range(3, 3 + problem.rank)]])
    d = None
    if ep is not None and ep.reads_d:  # D in dW's order, as the GEMM's [G, M, N]
        d_t = ir.RankedTensorType(op.operands[2].type)
        flat = ir.RankedTensorType.get([shape.groups, shape.m, shape.n], d_t.element_type)
        d = tensor_d.CollapseShapeOp(flat, op.operands[2], groups).result
    result_t = ir.RankedTensorType.get(c_shape, c_type)
    with ir.Location.unknown():  # the kernel's ops need no location of the problem
        if plan.streamk is not None:  # a persistent grid and its workspace: kernels/streamk_sm80.py
            from convbw_mlir.kernels import streamk_sm80

            result = streamk_sm80.build_dispatch(
                entry.executable, ENTRY, dy, x, shape, t, plan.streamk, out, entry.subgroup_size, top
            )
        else:
            operands = [dy, x] if not fused or d is None else [dy, x, d]
            result = build_dispatch(entry, body, operands, result_t, top)
    result.owner.attributes[PLAN_ATTR] = op.attributes[convbw.PLAN_ATTR]
    return _sum_splits(result, out, ep, d, units=_split_units(plan)) if shape.splits > 1 else result


def _expand_groups(problem, result: ir.Value) -> ir.Value:
    """``[G, K, taps * C]`` -> dW's own shape (GKYXC or GKCYX: the taps and channels split out)."""
    groups = reassociation([[0], [1], [2, *range(3, 3 + problem.rank)]])
    return tensor_d.ExpandShapeOp(convbw.tensor_type(problem, "dw"), result, groups, [], list(problem.dw_shape)).result


def _expand_k_c(problem, result: ir.Value) -> ir.Value:
    """The fp8 TN GEMM's ``[K, C]`` -> dW's own shape."""
    split_at = problem.dims("dw").index("K") + 1
    dims = [list(range(split_at)), list(range(split_at, len(problem.dw_shape)))]
    return tensor_d.ExpandShapeOp(convbw.tensor_type(problem, "dw"), result, reassociation(dims), [],
                                  list(problem.dw_shape)).result  # fmt: skip


def _is_fp8(plan) -> bool:
    from convbw_mlir.policies import sm90_fp8

    return sm90_fp8.is_fp8(plan)


def _is_sm90(plan) -> bool:
    from convbw_mlir.policies import sm90

    return sm90.is_sm90(plan)


@dataclass(frozen=True)
class Kind:
    """One kind of explicit plan: which plans it ``takes``, the dispatch it ``build``s (on the op's operands, at
    the op; the executable at ``top``) and how its result ``expand``s into dW; ``tensor_maps``: its kernel reads
    CUtensorMaps the direct launch encodes (the entry function's reflection says so)."""

    name: str
    takes: Callable[[Any], bool]
    build: Callable[[ir.Operation, Any, Any, str, ir.InsertionPoint], ir.Value]
    expand: Callable[[Any, ir.Value], ir.Value]
    tensor_maps: bool = False


# The plan kinds, first match wins (the TMA kernels first: an fp8 or wgmma plan may also carry a split).
KINDS: tuple[Kind, ...] = (
    Kind("fp8", _is_fp8, _fp8_dispatch, _expand_k_c, tensor_maps=True),
    Kind("sm90", _is_sm90, _sm90_dispatch, _expand_groups, tensor_maps=True),
    Kind("depthwise", lambda plan: plan.depthwise is not None, _depthwise_dispatch, _expand_groups),
    Kind("gemv", lambda plan: plan.gemv is not None, _gemv_dispatch, _expand_groups),
    Kind("merged", lambda plan: plan.merge is not None, _merged_dispatch, _expand_groups),
    Kind("gemm", lambda plan: True, _gemm_dispatch, _expand_groups),
)


@register
class ExplicitKernel(ConvbwPass):
    argument = "convbw-explicit-kernel"
    description = (
        "Replace each convbw.conv_bwd_weight whose plan has strategy explicit by a flow.dispatch of a "
        "hal.executable.source whose kernel (cp.async, ldmatrix, mma.sync) is built from the plan."
    )

    def run(self, module: ir.Operation) -> None:
        count = 0
        for op in collect_ops(module, convbw.OP_NAME):
            plan = convbw.plan_of(op)
            if plan is None or plan.strategy != Strategy.EXPLICIT:
                continue
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            try:  # a plan written by hand reaches here unchecked
                check_plan(problem, plan)
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            if computed_problem(problem, plan) != problem:  # its kernel is the layout-2 op's
                raise self.fail(
                    op, f"a {problem.layout} op whose plan computes it in layout 2: run convbw-relayout first"
                )
            kind = next(k for k in KINDS if k.takes(plan))
            name = f"convbw_explicit_{count}"
            with op.location, ir.InsertionPoint(op):
                top = ir.InsertionPoint.at_block_begin(module.regions[0].blocks[0])
                dw = kind.expand(problem, kind.build(op, problem, plan, name, top))
            if kind.tensor_maps:
                _mark_tensor_maps(module, name)
            count += 1
            op.results[0].replace_all_uses_with(dw)
            op.erase()
