"""The policy of our AMD kernels (``convbw_mlir/kernels/gemm_cdna.py``: MFMA on CDNA; ``gemm_rdna.py``: WMMA
on RDNA 3 and 4): the forms and their tiling, which problems and plans they take and why not (pure Python:
the plan asks it, :func:`plan` and :func:`refusals`, once). The implicit-GEMM view and the occupancy rule
of the split are the sm_80 kernel's (:mod:`convbw_mlir.policies.sm80`). They take layouts 4 and 2
(NHWGC/GKYXC/NHWGK, any channel count: plain global loads of 8, 4, 2 or 1 channels), f16 and bf16 in
(the target's bf16 MFMA/WMMA), dW f32 or the input type; 2-D problems, or any rank for a plain 1x1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from convbw_mlir.plan_data import Overrides, Plan, PlanError, Strategy, Tile
from convbw_mlir.policies.sm80 import ROW_PAD, GemmShape, auto_splits, gemm_shape, unsupported
from convbw_mlir.policies.split import check, explicit_split, split_refusals
from convbw_mlir.targets import Target

__all__ = ["AMD_FORMS", "AMD_LOAD", "CDNA_INTRINSIC", "DTYPES", "FORCE_FORM_ENV", "CdnaTiling", "plan", "refusals",
           "takes_by_default", "tiling"]  # fmt: skip


CDNA_INTRINSIC = "MFMA_F32_16x16x16_F16"
DTYPES = ("f16", "bf16")  # the input types the AMD kernel takes (dW: f32 or one of them)

# The AMD matrix forms the explicit kernel writes, by IREE's intrinsic name (a target's table entry
# picks one): f16/bf16 of A (and of B) a lane for one 16x16x16 instruction, f32 accumulators a lane, wave
# size. MFMA (CDNA, wave64): 4 and 4; WMMA on RDNA 3 (gfx11, wave32): 16 (lanes 16-31 repeat lanes 0-15)
# and 8; RDNA 4 (gfx12): 8 and 8 (IREE's IREEGPUAttrs.cpp, getSingleSubgroupLayout). bf16 has the f16
# forms' lane maps (AMD's calculator: v_mfma_f32_16x16x16_bf16, v_wmma_f32_16x16x16_bf16).
AMD_FORMS = {
    f"{name}_{t}": form
    for name, form in (("MFMA_F32_16x16x16", (4, 4, 64)), ("WMMAR3_F32_16x16x16", (16, 8, 32)),
                       ("WMMAR4_F32_16x16x16", (8, 8, 32)))
    for t in ("F16", "BF16")
}  # fmt: skip
AMD_LOAD = 8  # 16-bit elements of one 16-byte global load, LDS store and chunk of the reduction


@dataclass(frozen=True)
class CdnaTiling:
    """The AMD kernel's numbers (CDNA MFMA and RDNA WMMA forms): workgroup tile ``bm x bn x bk``, waves of
    ``wave`` lanes each ``wm x wn``, two LDS buffers (global -> registers -> LDS, double-buffered), the
    matrix ``intrinsic`` (a key of :data:`AMD_FORMS`)."""

    bm: int = 128
    bn: int = 128
    bk: int = 32
    wm: int = 32  # 8 waves of 32x64: 2 waves a SIMD on gfx942 (64x64 waves: 257 registers, 1)
    wn: int = 64
    wave: int = 64
    intrinsic: str = CDNA_INTRINSIC

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * self.wave

    @property
    def waves(self) -> int:
        return self.threads // self.wave

    @property
    def row(self) -> int:
        return self.bk + ROW_PAD

    def lds_bytes(self) -> int:
        return 2 * (self.bm + self.bn) * self.row * 2

    def planned_occupancy(self, target) -> int:  # target: convbw_mlir.targets.Target
        """Waves a SIMD the plan expects: what the two LDS buffers and the target's wave slots allow
        (the ISA report's LDS rule, convbw_mlir.build.isa.parse_rocmasm). The kernel meets it if its registers
        stay within :meth:`register_budget`."""
        by_lds = (target.lds_per_cu // self.lds_bytes()) * self.waves // target.simds_per_cu
        return max(1, min(target.max_waves_per_simd, by_lds))

    def register_budget(self, target) -> int:
        """The most registers a lane (VGPRs + AGPRs) that keep :meth:`planned_occupancy` (whole granules)."""
        per_wave = target.register_file // self.planned_occupancy(target)
        return min(target.registers, per_wave // target.register_granule * target.register_granule)

    def problems(self, shape: GemmShape, lds_cap: int) -> list[str]:
        """Why this tiling cannot compute ``shape`` ("field: value ..." lines); empty if it can.

        Any M, N and reduction (ragged edges are masked), any filter, stride, dilation and padding (B's
        addresses computed per element), split-K: only the tiling itself can be wrong."""
        why = []
        if self.intrinsic not in AMD_FORMS:
            why.append(f"intrinsic: {self.intrinsic} (the AMD forms: {', '.join(AMD_FORMS)})")
        elif AMD_FORMS[self.intrinsic][2] != self.wave:
            why.append(f"intrinsic: {self.intrinsic} runs on waves of {AMD_FORMS[self.intrinsic][2]}, not {self.wave}")
        if self.bm % self.wm or self.bn % self.wn or self.wm % 16 or self.wn % 16 or self.bk % 16:
            why.append(f"tiling: wave tile {self.wm}x{self.wn} does not divide {self.bm}x{self.bn} in 16x16 tiles")
        for name, rows in (("bm", self.bm), ("bn", self.bn)):
            if (rows * self.bk // AMD_LOAD) % self.threads:
                why.append(f"tiling: the {name}x{self.bk} tile is no whole number of 16-byte loads per thread")
        if self.threads > 1024:
            why.append(f"tiling: {self.threads} threads a workgroup, over 1024")
        if self.lds_bytes() > lds_cap:
            why.append(f"tiling: {self.lds_bytes()} B of LDS, over {lds_cap}")
        return why


# Test-only: the intrinsic whose operand form every RDNA kernel is built with (the plan's is ignored);
# the kernel cache's key names it, so a forced kernel is never stored under the plan's own key.
FORCE_FORM_ENV = "CONVBW_TEST_FORCE_WMMA_FORM"


# -- what the plan asks -------------------------------------------------------------------------------------
def takes_by_default(problem: Any) -> bool:
    """Never: the AMD kernels are compiled and emulated, never measured (no AMD GPU here), so the plan
    chooses them only when asked (strategy explicit)."""
    return False


def tiling(plan: Plan) -> CdnaTiling:
    """The kernel tiling a plan's tile stands for (the target's wave size)."""
    t = plan.tile
    return CdnaTiling(t.m, t.n, t.k, t.m // t.subgroups_m, t.n // t.subgroups_n, plan.target_info.subgroup_size,
                      t.intrinsic)  # fmt: skip


def plan(problem: Any, tgt: Target, opts: Overrides) -> Plan:
    """The AMD explicit plan: the target's first intrinsic the AMD kernel has a form of (its table entry
    decides MFMA or WMMA and which WMMA operand form), the tile options, split-K as on NVIDIA.

    Raises:
        PlanError: the kernel cannot carry the plan out, or an option it does not take.
    """
    if opts.streamk is not None:
        raise PlanError(f"streamk: {opts.streamk!r} on target {tgt.name} (StreamK is written for sm_80 only)")
    if opts.producers is not None:
        raise PlanError(f"producers: {opts.producers} on target {tgt.name} (wave specialization is written for "
                        "sm_80 only: named barriers)")  # fmt: skip
    if opts.merge_groups not in (None, 1):
        raise PlanError(f"merge-groups: {opts.merge_groups} on target {tgt.name} (group merging is written for sm_80 "
                        "only)")  # fmt: skip
    given = opts.tile
    intr = next((i.name for i in tgt.intrinsics.get(problem.dtype, ()) if i.name in AMD_FORMS), None)
    if intr is None:
        raise PlanError(f"dtype: {problem.dtype}: target {tgt.name} has no matrix instruction the AMD kernel writes")
    c = CdnaTiling(wave=tgt.subgroup_size, intrinsic=intr)
    c = replace(c, wm=given.get("m", c.bm) // given.get("subgroups_m", c.bm // c.wm),
                wn=given.get("n", c.bn) // given.get("subgroups_n", c.bn // c.wn))  # fmt: skip
    c = replace(c, bm=given.get("m", c.bm), bn=given.get("n", c.bn), bk=given.get("k", c.bk))
    if given.get("stages", 2) != 2:
        raise PlanError(f"stages: {given['stages']}: the AMD forms double-buffer LDS (2 stages)")
    chosen = Plan(tgt.name, Strategy.EXPLICIT, gemm=True, tile=Tile(c.bm, c.bn, c.bk, c.bm // c.wm, c.bn // c.wn, 2,
                                                                     intr))  # fmt: skip
    check(problem, chosen, refusals)
    return explicit_split(problem, chosen, gemm_shape(problem), c, tgt, opts, auto_splits, refusals)


def refusals(problem: Any, plan: Plan) -> list[str]:
    """Why this kernel cannot carry ``plan`` out ("field: value" lines; empty: it can)."""
    if plan.tile is None:
        return ["tile: none"] + split_refusals(problem, plan)
    cap = plan.target_info.lds_bytes
    why = unsupported(problem, tiling(plan), cap, DTYPES, any_channels=True, any_rank=False)
    if plan.streamk is not None:
        why.append(f"streamk: {plan.streamk.workgroups} on target {plan.target} (StreamK is written for sm_80 only)")
    if plan.wavespec is not None:
        why.append(f"producers: {plan.wavespec.producers} on target {plan.target} (wave specialization is written "
                   "for sm_80 only)")  # fmt: skip
    if plan.merge is not None:
        why.append(
            f"merge: {plan.merge.groups} groups on target {plan.target} (group merging is written for sm_80 only)"
        )
    if not why:
        why = tiling(plan).problems(gemm_shape(problem, plan.k_batch), cap)
        if plan.target_info.intrinsic(problem.dtype, plan.tile.intrinsic) is None:  # a stored plan's
            why.append(f"tile: intrinsic {plan.tile.intrinsic} is not one of {plan.target}'s for {problem.dtype}")
    return why + split_refusals(problem, plan)
