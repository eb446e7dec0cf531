"""convbw-plan{target=<t> k-batch=.. tile-m=.. ...}: decide each ``convbw.conv_bwd_weight``'s plan and
attach it to the op as its ``plan`` attribute.

    %dw = convbw.conv_bwd_weight(%x, %dy) {...}
  ->
    %dw = convbw.conv_bwd_weight(%x, %dy) {..., plan = {gemm = false, strategy = "mma", target = "gfx942",
            split = {chunk = 8 : i64, dim = "n", k_batch = 4 : i64},
            tile = {intrinsic = "MFMA_F32_16x16x16_F16", k = 64 : i64, m = 128 : i64, ...}}}

The decision is :func:`convbw_mlir.plan.decide`'s; the options are its overrides, validated there
(a wrong value fails when the pipeline is parsed). An op that already carries a plan keeps it, so a
plan written in the input IR (or by an earlier run) is replayed as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.framework import ConvbwPass, collect_ops, option, register

from convbw_mlir.ir_imports import ir
from convbw_mlir.plan import LAYOUT4_FORMS, STRATEGY_OPTIONS, Overrides, PlanError, decide
from convbw_mlir.targets import TARGETS

__all__ = ["PlanPass"]


@register
class PlanPass(ConvbwPass):
    argument = "convbw-plan"
    description = (
        "Decide each convbw.conv_bwd_weight's plan for the target (GEMM form, split-K, strategy mma/simt/iree "
        "and tile) and attach it as the op's plan attribute; options override the plan's choices."
    )

    @dataclass
    class Options:
        target: str = option("host", "the target the plan is for", tuple(TARGETS))
        k_batch: int | str = option(
            "auto", "number of batch splits, rows (one partial per image and output row), or auto", ("auto", "rows")
        )
        plan_for: str | None = option(None, "target whose CU count sizes the split (default: target)", tuple(TARGETS))
        tile_m: int | None = option(None, "workgroup tile over out channels (M), in elements")
        tile_n: int | None = option(None, "workgroup tile over in channels (N), in elements")
        tile_k: int | None = option(None, "reduction elements per step")
        subgroups_m: int | None = option(None, "subgroups (waves/warps) along M")
        subgroups_n: int | None = option(None, "subgroups along N")
        stages: int | None = option(None, "prefetch stages (IREE's prefetch_num_stages)")
        gemm: str | None = option(None, "plain GEMMs (1x1): our mma tile or IREE's own (default: the target's)",
                                  ("mma", "iree"))  # fmt: skip
        grouped: str | None = option(None, "grouped convolutions (G>1): mma or iree (default: the target's)",
                                     ("mma", "iree"))  # fmt: skip
        reduction_innermost: bool = option(
            False, "transpose a channels-last GEMM's x and dy so the reduction is innermost (layout NGCW)"
        )
        strategy: str | None = option(None, "explicit: the kernel our passes write; codegen: IREE's codegen, "
                                      "configured (default: the plan's choice)", STRATEGY_OPTIONS)  # fmt: skip
        streamk: int | str | None = option(
            None, "StreamK's persistent workgroups (explicit): auto (the target's SMs) or a number", ("auto",)
        )
        streamk_fixup: str | None = option(None, "how StreamK combines partial tiles: linear or tree",
                                           ("linear", "tree"))  # fmt: skip
        producers: int | None = option(None, "explicit, layout 2: producer warps (2 or 4) of a wave-specialized kernel")
        layout4: str | None = option(None, "layout 4 on NVIDIA: relayout (the channels-last kernels between "
                                     "transposes) or gather (the layout-4 kernel; default: the plan's choice)",
                                     LAYOUT4_FORMS)  # fmt: skip
        merge_groups: int | None = option(None, "explicit, layout 2: thin groups one implicit GEMM computes (1: one "
                                          "a GEMM; default: the plan's rule)")  # fmt: skip
        wgmma_merge: int | None = option(None, "explicit, sm_90a: groups of C < 64 channels a 64-channel box of the "
                                         "wgmma kernel's boxed form (default: the plan's rule, off)")  # fmt: skip
        wgmma_rows: int | None = option(None, "explicit, sm_90a: the wgmma kernel's tile rows, 64 or 128 (one or two "
                                        "consumer warpgroups; default: 64 where K <= 64, else 128)")  # fmt: skip
        wgmma_pad_channels: bool | None = option(None, "explicit, sm_90a: the wgmma kernel on in-channels a multiple "
                                                 "of 8 but not of 64, each tap's channels padded to 64-channel boxes: "
                                                 "true (default: the plan's rule padded-channels, on dense layers "
                                                 "padded to at most 1.28x their columns)")  # fmt: skip
        wgmma_stages: int | None = option(None, "explicit, sm_90a: the wgmma kernel's ring of shared-memory stages "
                                          "(k tiles in flight), 2 up to what the tile's ring fits in shared memory "
                                          "(default: 4)")  # fmt: skip
        fold_rank: bool | None = option(None, "a 3-D problem with a unit filter extent as its 2-D twin by reshapes: "
                                        "true or false (default: the plan's rule, off)")  # fmt: skip

    def __init__(self, options=None, **kwargs) -> None:
        super().__init__(options, **kwargs)
        if self.options.target not in TARGETS:
            raise PlanError(f"target: unknown target {self.options.target!r}; known: {', '.join(TARGETS)}")
        self.overrides()  # validate now, so a bad option fails when the pipeline is built

    def overrides(self) -> dict:
        fields = asdict(self.options)
        fields.pop("target")
        if fields["wgmma_pad_channels"] is None:  # unset: off (None keeps it out of the printed pipeline)
            fields.pop("wgmma_pad_channels")
        Overrides(**fields)
        return fields

    def run(self, module: ir.Operation) -> None:
        for op in collect_ops(module, convbw.OP_NAME):
            problem = convbw.verify_op(op)
            if problem is None:
                raise self.fail(op, "invalid convbw.conv_bwd_weight op")
            if convbw.PLAN_ATTR in op.attributes:
                continue
            try:
                plan = decide(problem, self.options.target, convbw.split_of(op), **self.overrides())
            except PlanError as e:
                raise self.fail(op, str(e)) from None
            convbw.set_plan(op, plan)
