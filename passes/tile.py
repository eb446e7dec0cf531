"""convbw-tile{target=<t> tile-m=.. tile-n=.. tile-k=.. subgroups-m=.. subgroups-n=.. stages=..}: choose
each contraction's GPU strategy and tile, recorded as ``convbw.tile`` on the ``linalg.generic``.

Three strategies (the H200 measurements behind the choice: bench/results/h200_2026-11-21_tuning.md):
  * ``mma``: a workgroup tile of M (out channels) x N (in channels, the innermost filter channel) for one
    group and filter tap, a reduction step, a subgroup layout and prefetch stages, sized from the target
    model (:func:`convbw_mlir.heuristics.choose_tile`): within half the LDS, tiles that are powers of two
    from one intrinsic up to 128 so that unaligned sizes (K=36, C=3, K=2376) pad only to the next one;
    ``convbw-map-mma`` turns it into IREE's ``compilation_info``.
  * ``simt``: depthwise and thin groups (K < 8 or C * filter < 16, or no K or C loop) get no matrix
    instructions. Over a rows split (``convbw-split-k`` picks it where the partials are small) a thread
    per (image, output row, group, out channel) holds all filter taps and in channels and reduces its
    row serially, threads along the channels (:func:`convbw_mlir.heuristics.choose_simt_tile`);
    otherwise (1-D problems, batch splits) IREE's own reduction codegen with split-K spreading the
    reduction across workgroups.
  * ``iree``: IREE's own configuration, for plain GEMMs (1x1 after ``convbw-explicit-gemm``; option
    ``gemm=mma`` gives ours, the RDNA pipelines' choice because IREE's spill there: on the H200 ours
    was not faster, and IREE's sm_80 kernel with ours was wrong for split GEMMs whose reduction our
    step pads, so a split GEMM takes a step that divides its reduction, or IREE's config), grouped
    convolutions (G>1; ``grouped=mma`` gives ours, RDNA's choice because IREE's spill there), where
    IREE's tiles measured as fast or faster than ours on the H200 (ResNeXt G=32 C=8: 807 us vs 1258 us,
    bench/results/h200_2026-11-22_tiles.md), and channels-first layouts (x not C-innermost), where IREE
    hung compiling our tile.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, option, register
from convbw_mlir.passes.lower_to_linalg import CONTRACTION_ATTR

from convbw_mlir.heuristics import SimtTile, Tile, choose_simt_tile, choose_tile, simt_threads_fit
from convbw_mlir.ir_imports import ir
from convbw_mlir.targets import TARGETS

__all__ = ["SIMT_FIELDS", "TILE_ATTR", "Tile", "TilePass", "contractions", "parallel_loops", "read_tile", "rows_split"]

TILE_ATTR = "convbw.tile"
_GPU_TARGETS = tuple(n for n, t in TARGETS.items() if t.is_gpu)


def contractions(module: ir.Operation) -> list[ir.Operation]:
    """The linalg.generic ops built by convbw-lower-to-linalg (they carry ``convbw.contraction``)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.generic" and CONTRACTION_ATTR in op.attributes:
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def loops_of(op: ir.Operation) -> list[str]:
    return [ir.StringAttr(a).value for a in op.attributes[CONTRACTION_ATTR]["loops"]]


def parallel_loops(op: ir.Operation) -> list[str]:
    """The contraction's parallel loops, in order (they come first)."""
    iterators = [str(it) for it in op.attributes["iterator_types"]]
    return [name for name, it in zip(loops_of(op), iterators) if "parallel" in it]


def rows_split(op: ir.Operation) -> bool:
    """Whether the contraction is the first stage of a rows split (loops n and o0 parallel)."""
    return bool(set(parallel_loops(op)) & {"n", "o0"})


SIMT_FIELDS = ("rows", "groups", "channels")


def read_tile(op: ir.Operation) -> tuple[str, Tile | SimtTile | None]:
    """(strategy, tile) recorded by this pass: a Tile for mma, a SimtTile for simt over a rows split."""
    attr = op.attributes[TILE_ATTR]
    strategy = ir.StringAttr(attr["strategy"]).value
    if strategy == "simt" and "rows" in attr:
        return strategy, SimtTile(**{f: ir.IntegerAttr(attr[f]).value for f in SIMT_FIELDS})
    if strategy != "mma":
        return strategy, None
    ints = {f: ir.IntegerAttr(attr[f]).value for f in ("m", "n", "k", "subgroups_m", "subgroups_n", "stages")}
    return strategy, Tile(**ints, intrinsic=ir.StringAttr(attr["intrinsic"]).value)


def _unpadded_reduction(tile: Tile, op: ir.Operation, target, dtype: str) -> Tile | None:
    """The tile with a reduction step that divides a split GEMM's reduction, or None if none does.

    IREE 3.13's sm_80 kernels for a split GEMM (loop ``s`` parallel) whose reduction our config pads
    gave wrong dW on the H200: 1x1 K=C=128 N=32 28x28 split 32 (784 a split, step 64) and 16, and
    K=C=1024 N=4 7x7 split 4; the same with step 16 (784 = 49 x 16), unsplit (padded), or with an
    unpadded reduction were right (bench/results/h200_2026-11-22_tiles.md).
    """
    parallel = len(parallel_loops(op))
    reduction = math.prod(list(op.attributes[CONTRACTION_ATTR]["extents"])[parallel:])
    intr_k = target.intrinsic(dtype, tile.intrinsic).k
    k = tile.k
    while k >= intr_k and reduction % k:
        k //= 2
    return dataclasses.replace(tile, k=k) if k >= intr_k else None


@register
class TilePass(ConvbwPass):
    argument = "convbw-tile"
    description = (
        "Choose each contraction's GPU strategy (mma, simt, iree) and, for mma, the workgroup tile "
        "(M x N), reduction step, subgroup layout and prefetch stages from the target model; options override."
    )

    @dataclass
    class Options:
        target: str = option("gfx942", "the GPU target whose model sizes the tiles", _GPU_TARGETS)
        tile_m: int | None = option(None, "workgroup tile over out channels (M), in elements")
        tile_n: int | None = option(None, "workgroup tile over in channels (N), in elements")
        tile_k: int | None = option(None, "reduction elements per step")
        subgroups_m: int | None = option(None, "subgroups (waves/warps) along M")
        subgroups_n: int | None = option(None, "subgroups along N")
        stages: int | None = option(None, "prefetch stages (IREE's prefetch_num_stages)")
        gemm: str = option(
            "iree", "plain GEMMs (1x1 after explicit-gemm): our mma tile, or IREE's own", ("mma", "iree")
        )
        grouped: str = option("iree", "grouped convolutions (G>1): our mma tile, or IREE's own", ("mma", "iree"))

    def run(self, module: ir.Operation) -> None:
        target = TARGETS[self.options.target]
        overrides = {
            key: getattr(self.options, name)
            for key, name in (("m", "tile_m"), ("n", "tile_n"), ("k", "tile_k"), ("subgroups_m", "subgroups_m"),
                              ("subgroups_n", "subgroups_n"), ("stages", "stages"))
            if getattr(self.options, name) is not None
        }  # fmt: skip
        i64 = ir.IntegerType.get_signless(64)
        for op in contractions(module):
            problem = convbw.problem_from_attr(op.attributes[CONTRACTION_ATTR]["problem"])
            loops = loops_of(op)
            conv = any(name.startswith("f") for name in loops)
            k_batch = ir.IntegerAttr(op.attributes[CONTRACTION_ATTR]["k_batch"]).value
            try:
                tile = choose_tile(problem, target, k_batch=k_batch, **overrides)
            except ValueError as e:
                raise self.fail(op, str(e)) from None
            if tile.intrinsic is not None and not conv and "s" in loops:
                tile = _unpadded_reduction(tile, op, target, problem.dtype)
            if tile is None:  # a split GEMM whose reduction no step divides: IREE's own config
                entries = {"strategy": ir.StringAttr.get("iree")}
            elif tile.intrinsic is None or "k" not in loops or "c" not in loops:
                entries = {"strategy": ir.StringAttr.get("simt")}
                if rows_split(op) and simt_threads_fit(problem):
                    simt = choose_simt_tile(problem, target)
                    entries |= {name: ir.IntegerAttr.get(i64, getattr(simt, name)) for name in SIMT_FIELDS}
            elif (
                (not conv and self.options.gemm == "iree")
                or (problem.groups > 1 and self.options.grouped == "iree")
                # Our IGEMM tile assumes C innermost in x; on channels-first x (NCHW families) IREE 3.13
                # did not finish compiling it (1-D NCW K=16 C=8 for gfx942: still running after 60 s).
                or problem.layout_family.x[-1] != "C"
            ):
                entries = {"strategy": ir.StringAttr.get("iree")}
            else:
                entries = {"strategy": ir.StringAttr.get("mma"), "intrinsic": ir.StringAttr.get(tile.intrinsic)}
                for name in ("m", "n", "k", "subgroups_m", "subgroups_n", "stages"):
                    entries[name] = ir.IntegerAttr.get(i64, getattr(tile, name))
            op.attributes[TILE_ATTR] = ir.DictAttr.get(entries)
