"""convbw-map-mma{target=<t>}: turn each ``convbw.tile`` of strategy ``mma`` (and ``simt`` over a rows
split) into IREE's ``compilation_info`` on the contraction. IREE honours a user's compilation_info on
the root op unless it rebuilds the op first; the lowering leaves it nothing to rebuild (no unit
dimensions, GEMM reduction loops merged), and the ISA matrix checks each kernel's configured config.

SIMT over a rows split: TileAndFuse with ``workgroup`` and ``thread`` tiles and a serial ``reduction``
(:func:`simt_compilation_info`).

The config is IREE's TileAndFuse pipeline with ``use_igemm_convolution``, so it indexes the IGEMM
loops: the generic's parallel loops in order ([s,] [g,] k, f..., c) and one collapsed reduction.
Units (measured, ../shared/DESIGN.md): ``workgroup`` and ``padding`` in elements; ``subgroup`` and
``reduction`` in intrinsic counts (reduction 4 with a K=16 intrinsic is 64 elements per step).
``padding`` is given when a size is not a tile multiple (IREE fails "op was not bufferized" otherwise).
TileAndFuse over VectorDistribute: it is the pipeline IREE itself picks for these convolutions and
the one whose IGEMM path accepts every layout here; the ISA report shows the MMA instructions it emits.
"""

from __future__ import annotations

from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, option, register
from convbw_mlir.passes.lower_to_linalg import CONTRACTION_ATTR
from convbw_mlir.passes.tile import _GPU_TARGETS, TILE_ATTR, contractions, loops_of, parallel_loops, read_tile

from convbw_mlir.heuristics import SimtTile, Tile
from convbw_mlir.ir_imports import ir
from convbw_mlir.targets import TARGETS, Target

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


def compilation_info(loops: list[str], extents: list[int], tile: Tile, target: Target, dtype: str) -> ir.Attribute:
    """``#iree_codegen.compilation_info`` for a convolution contraction with ``loops`` (names, in order)."""
    from iree.compiler.dialects import iree_gpu

    intr = target.intrinsic(dtype, tile.intrinsic)
    parallel = [n for n in loops if n in ("s", "g", "k", "c") or n.startswith("f")]
    sizes = dict(zip(loops, extents))
    igemm = any(n.startswith("f") for n in loops)
    workgroup, subgroup = [], []
    for name in parallel:
        if name == "k":
            workgroup.append(tile.m)
            subgroup.append(tile.m // (tile.subgroups_m * intr.m))
        elif name == "c":
            workgroup.append(tile.n)
            subgroup.append(tile.n // (tile.subgroups_n * intr.n))
        else:
            workgroup.append(1)
            subgroup.append(1)
    reductions = loops[len(parallel) :]
    red_extent = 1
    for name in reductions:
        red_extent *= sizes[name]
    if igemm:  # IGEMM collapses the reduction loops into one
        workgroup.append(0)
        subgroup.append(0)
        reduction = [0] * len(parallel) + [tile.k // intr.k]
    else:  # a plain contraction: one entry per loop; the innermost reduction loop feeds the intrinsic
        workgroup += [0] * len(reductions)
        subgroup += [0] * len(reductions)
        reduction = [0] * len(parallel) + [1] * (len(reductions) - 1) + [tile.k // intr.k]
    config = {
        "mma_kind": iree_gpu.MMAAttr.get(getattr(iree_gpu.MMAIntrinsic, tile.intrinsic)),
        "promote_operands": _i64_array([0, 1]),
        "workgroup": _i64_array(workgroup),
        "subgroup": _i64_array(subgroup),
        "reduction": _i64_array(reduction),
    }
    unaligned = sizes["k"] % tile.m or sizes["c"] % tile.n or red_extent % tile.k
    if unaligned:
        red_pad = [tile.k] if igemm else [1] * (len(reductions) - 1) + [tile.k]
        config["padding"] = _i64_array(workgroup[: len(parallel)] + red_pad)
    lowering = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(config))
    options = iree_gpu.PipelineOptionsAttr.get(
        prefetch_num_stages=tile.stages, no_reduce_shared_memory_bank_conflicts=False, use_igemm_convolution=igemm
    )
    configuration = ir.DictAttr.get({"gpu_pipeline_options": options})
    return _tile_and_fuse(lowering, tile.subgroups * target.subgroup_size, target, configuration)


def simt_compilation_info(loops: list[str], extents: list[int], parallel: int, tile: SimtTile,
                          target: Target) -> ir.Attribute:  # fmt: skip
    """``#iree_codegen.compilation_info`` for the SIMT strategy over a rows split (no matrix instructions).

    TileAndFuse with thread tiles: per workgroup ``rows`` of o0, ``groups`` of g, ``channels`` of k and
    every filter tap and in channel; per thread one (n, o0, g, k) with all taps and in channels; the
    remaining reduction loops one step at a time (a serial loop per thread).
    """
    from iree.compiler.dialects import iree_gpu

    per_workgroup = {"n": 1, "o0": tile.rows, "g": tile.groups, "k": tile.channels}
    workgroup, thread = [], []
    for name, extent in zip(loops[:parallel], extents[:parallel]):
        whole = name.startswith("f") or name == "c"
        workgroup.append(extent if whole else per_workgroup[name])
        thread.append(extent if whole else 1)
    reductions = len(loops) - parallel
    config = {
        "workgroup": _i64_array(workgroup + [0] * reductions),
        "thread": _i64_array(thread + [0] * reductions),
        "reduction": _i64_array([0] * parallel + [1] * reductions),
    }
    return _tile_and_fuse(iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(config)), tile.threads, target)


@register
class MapMma(ConvbwPass):
    argument = "convbw-map-mma"
    description = (
        "Attach IREE's compilation_info (TileAndFuse, IGEMM, the target's MFMA/WMMA/MMA intrinsic, tiles from "
        "convbw-tile) to each contraction tiled for matrix cores; other strategies keep IREE's own config."
    )

    @dataclass
    class Options:
        target: str = option("gfx942", "the GPU target (must match convbw-tile's)", _GPU_TARGETS)

    def run(self, module: ir.Operation) -> None:
        target = TARGETS[self.options.target]
        for op in contractions(module):
            if TILE_ATTR not in op.attributes:
                raise self.fail(op, "the contraction has no convbw.tile; run convbw-tile first")
            strategy, tile = read_tile(op)
            extents = list(op.attributes[CONTRACTION_ATTR]["extents"])
            if strategy == "simt" and tile is not None:
                parallel = len(parallel_loops(op))
                op.attributes["compilation_info"] = simt_compilation_info(loops_of(op), extents, parallel, tile, target)
                continue
            if strategy != "mma":
                continue
            problem = convbw.problem_from_attr(op.attributes[CONTRACTION_ATTR]["problem"])
            if target.intrinsic(problem.dtype, tile.intrinsic) is None:
                raise self.fail(op, f"intrinsic {tile.intrinsic} is not one of {target.name}'s for {problem.dtype}")
            op.attributes["compilation_info"] = compilation_info(loops_of(op), extents, tile, target, problem.dtype)
