"""convbw-map-mma: turn each ``convbw.tile`` of strategy ``mma`` (and ``simt`` over a rows
split) into IREE's ``compilation_info`` on the contraction. IREE honours a user's compilation_info on
the root op unless it rebuilds the op first; the lowering leaves it nothing to rebuild (no unit
dimensions, GEMM reduction loops merged), and the ISA matrix checks each kernel's configured config.

SIMT over a rows split: TileAndFuse with ``workgroup`` and ``thread`` tiles and a serial ``reduction``
(:func:`simt_compilation_info`).

The config is IREE's TileAndFuse pipeline with ``use_igemm_convolution``, so it indexes the IGEMM
loops: the generic's parallel loops in order ([s,] [g,] k, f..., c) and one collapsed reduction.
Units (measured: docs/decisions.md#config-units): ``workgroup`` and ``padding`` in elements; ``subgroup`` and
``reduction`` in intrinsic counts (reduction 4 with a K=16 intrinsic is 64 elements per step).
``padding`` is given when a size is not a tile multiple (IREE fails "op was not bufferized" otherwise).
TileAndFuse over VectorDistribute: it is the pipeline IREE itself picks for these convolutions and
the one whose IGEMM path accepts every layout here; the ISA report shows the MMA instructions it emits.
"""

from __future__ import annotations

from convbw_mlir.passes.framework import ConvbwPass, register
from convbw_mlir.passes.tile import TILE_ATTR, plan_of_contraction, read_tile

from convbw_mlir.contraction import contractions, read_contraction
from convbw_mlir.ir_imports import ir
from convbw_mlir.loops import Contraction
from convbw_mlir.plan import PlanError, SimtTile, Tile
from convbw_mlir.targets import Target

__all__ = ["MapMma", "compilation_info", "simt_compilation_info"]


def _i64_array(values: list[int]) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.IntegerAttr.get(i64, v) for v in values])


def _tile_and_fuse(lowering: ir.Attribute, threads: int, target: Target,
                   configuration: ir.DictAttr | None = None) -> ir.Attribute:  # fmt: skip
    """``compilation_info`` pairing ``lowering`` with IREE's TileAndFuse pipeline on ``threads`` threads."""
    from iree.compiler.dialects import iree_codegen, iree_gpu

    translation = iree_codegen.TranslationInfoAttr.get(
        iree_gpu.PipelineAttr.get(iree_gpu.LoweringPipeline.TileAndFuse),
        workgroup_size=[threads, 1, 1],
        subgroup_size=target.subgroup_size,
        **({"configuration": configuration} if configuration is not None else {}),
    )
    return iree_codegen.CompilationInfoAttr.get(lowering, translation)


def compilation_info(contraction: Contraction, tile: Tile, target: Target) -> ir.Attribute:
    """``#iree_codegen.compilation_info`` for a contraction tiled for matrix cores."""
    from iree.compiler.dialects import iree_gpu

    intr = target.intrinsic(contraction.problem.dtype, tile.intrinsic)
    igemm = contraction.is_convolution
    workgroup, subgroup = [], []
    for name in contraction.parallel:
        role = contraction.role(name)
        if role == "m":
            workgroup.append(tile.m)
            subgroup.append(tile.m // (tile.subgroups_m * intr.m))
        elif role == "n":
            workgroup.append(tile.n)
            subgroup.append(tile.n // (tile.subgroups_n * intr.n))
        else:
            workgroup.append(1)
            subgroup.append(1)
    parallel = contraction.n_parallel
    reductions = len(contraction.loops) - parallel
    if igemm:  # IGEMM collapses the reduction loops into one
        workgroup.append(0)
        subgroup.append(0)
        reduction = [0] * parallel + [tile.k // intr.k]
    else:  # a plain contraction: one entry per loop; the innermost reduction loop feeds the intrinsic
        workgroup += [0] * reductions
        subgroup += [0] * reductions
        reduction = [0] * parallel + [1] * (reductions - 1) + [tile.k // intr.k]
    config = {
        "mma_kind": iree_gpu.MMAAttr.get(getattr(iree_gpu.MMAIntrinsic, tile.intrinsic)),
        "promote_operands": _i64_array([0, 1]),
        "workgroup": _i64_array(workgroup),
        "subgroup": _i64_array(subgroup),
        "reduction": _i64_array(reduction),
    }
    sizes = {contraction.role(name): extent for name, extent in contraction.loops[:parallel]}
    unaligned = sizes["m"] % tile.m or sizes["n"] % tile.n or contraction.reduction_extent % tile.k
    if unaligned:
        red_pad = [tile.k] if igemm else [1] * (reductions - 1) + [tile.k]
        config["padding"] = _i64_array(workgroup[:parallel] + red_pad)
    lowering = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(config))
    options = iree_gpu.PipelineOptionsAttr.get(
        prefetch_num_stages=tile.stages, no_reduce_shared_memory_bank_conflicts=False, use_igemm_convolution=igemm
    )
    configuration = ir.DictAttr.get({"gpu_pipeline_options": options})
    return _tile_and_fuse(lowering, tile.subgroups * target.subgroup_size, target, configuration)


def simt_compilation_info(contraction: Contraction, tile: SimtTile, target: Target) -> ir.Attribute:
    """``#iree_codegen.compilation_info`` for the SIMT strategy over a rows split (no matrix instructions).

    TileAndFuse with thread tiles: per workgroup ``rows`` output rows, ``groups`` groups, ``channels``
    out channels and every filter tap and in channel; per thread one (image, row, group, out channel)
    with all taps and in channels; the remaining reduction loops one step at a time (a serial loop).
    """
    from iree.compiler.dialects import iree_gpu

    per_workgroup = {"image": 1, "row": tile.rows, "group": tile.groups, "m": tile.channels}
    workgroup, thread = [], []
    for name, extent in contraction.loops[: contraction.n_parallel]:
        role = contraction.role(name)
        whole = role in ("filter", "n")
        workgroup.append(extent if whole else per_workgroup[role])
        thread.append(extent if whole else 1)
    reductions = len(contraction.loops) - contraction.n_parallel
    config = {
        "workgroup": _i64_array(workgroup + [0] * reductions),
        "thread": _i64_array(thread + [0] * reductions),
        "reduction": _i64_array([0] * contraction.n_parallel + [1] * reductions),
    }
    return _tile_and_fuse(iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(config)), tile.threads, target)


@register
class MapMma(ConvbwPass):
    argument = "convbw-map-mma"
    description = (
        "Attach IREE's compilation_info (TileAndFuse, IGEMM, the target's MFMA/WMMA/MMA intrinsic, tiles from "
        "convbw-tile; the target from the plan) to each contraction tiled for matrix cores or SIMT threads; "
        "other strategies keep IREE's own config."
    )

    def run(self, module: ir.Operation) -> None:
        for op in contractions(module):
            if TILE_ATTR not in op.attributes:
                raise self.fail(op, "the contraction has no convbw.tile; run convbw-tile first")
            contraction = read_contraction(op)
            try:
                target = plan_of_contraction(contraction).target_info
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            strategy, tile = read_tile(op)
            if strategy == "simt" and tile is not None:
                op.attributes["compilation_info"] = simt_compilation_info(contraction, tile, target)
            elif strategy == "mma":
                if target.intrinsic(contraction.problem.dtype, tile.intrinsic) is None:
                    dtype = contraction.problem.dtype
                    raise self.fail(op, f"intrinsic {tile.intrinsic} is not one of {target.name}'s for {dtype}")
                op.attributes["compilation_info"] = compilation_info(contraction, tile, target)
