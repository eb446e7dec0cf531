"""The targets convbw-mlir compiles for: IREE flags, runtime driver and the hardware facts the GPU
passes plan with. Importable without the IREE compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RUNS_SM80", "TARGETS", "Intrinsic", "Target", "get_target"]


@dataclass(frozen=True)
class Intrinsic:
    """A matrix-core instruction as IREE names it (``#iree_gpu.mma_layout<NAME>``), with its M x N x K."""

    name: str
    m: int
    n: int
    k: int


def _mfma(kind: str, shapes: tuple[tuple[int, int, int], ...]) -> tuple[Intrinsic, ...]:
    return tuple(Intrinsic(f"MFMA_F32_{m}x{n}x{k}_{kind}", m, n, k) for m, n, k in shapes)


# IREE's intrinsic names: compiler/src/iree/compiler/Codegen/Dialect/GPU/IR/IREEGPUEnums.td (MMAIntrinsic).
_CDNA2_3 = {  # gfx90a / gfx942: 16x16x16 and 32x32x8 for f16/bf16 (bf16 "_1k" forms), 16x16x4 for f32
    "f16": _mfma("F16", ((16, 16, 16), (32, 32, 8))),
    "bf16": _mfma("BF16", ((16, 16, 16), (32, 32, 8))),
    "f32": _mfma("F32", ((16, 16, 4),)),
}
_CDNA4 = {  # gfx950 doubles K: 16x16x32 and 32x32x16 (CDNA4 ISA guide, "MFMA" tables)
    "f16": _mfma("F16", ((16, 16, 32), (32, 32, 16), (16, 16, 16))),
    "bf16": _mfma("BF16", ((16, 16, 32), (32, 32, 16), (16, 16, 16))),
    "f32": _mfma("F32", ((16, 16, 4),)),
}
_RDNA3 = {t: (Intrinsic(f"WMMAR3_F32_16x16x16_{t.upper()}", 16, 16, 16),) for t in ("f16", "bf16")}
_RDNA4 = {t: (Intrinsic(f"WMMAR4_F32_16x16x16_{t.upper()}", 16, 16, 16),) for t in ("f16", "bf16")}
_SM80 = {t: (Intrinsic(f"NV_MMA_SYNC_F32_16x8x16_{t.upper()}", 16, 8, 16),) for t in ("f16", "bf16")}


@dataclass(frozen=True)
class TilePolicy:
    """How plans tile on a target family (each choice measured: docs/decisions.md)."""

    gemm: str = "iree"  # plain GEMMs (1x1): "mma" = our tile, "iree" = IREE's own config
    grouped: str = "iree"  # grouped convolutions (G > 1): "mma" or "iree"
    narrow_n: bool = True  # halve the N tile while the split grid leaves compute units idle
    acc_per_lane: tuple[tuple[str, int], ...] = ()  # cap of f32 accumulators a lane, by input type


_RDNA_POLICY = TilePolicy(gemm="mma", grouped="mma", narrow_n=False, acc_per_lane=(("f16", 64), ("bf16", 32)))


@dataclass(frozen=True)
class Target:
    """One compile target and the hardware facts the GPU passes plan with.

    Attributes:
        name: what users type (``host``, ``gfx942``, ``sm_80``...).
        backend: IREE HAL target device (``local``, ``hip``, ``cuda``).
        driver: IREE runtime driver that runs its vmfb (``local-task``, ``hip``, ``cuda``).
        arch: the chip name IREE's backend takes (``gfx942``, ``sm_80``; ``host`` for the CPU).
        family: ``cpu``, ``cdna``, ``rdna`` or ``nvidia``.
        description: the products it means (the numbers below are for the first one named).
        compute_units: CUs (AMD) or SMs (NVIDIA).
        subgroup_size: wave / warp size the kernels are compiled for.
        lds_bytes: shared memory one workgroup may use.
        registers: 32-bit registers one lane may use (AMD: VGPRs + AGPRs of one wave).
        max_waves_per_cu: resident waves per CU/SM at full occupancy (for the split-K occupancy model).
        intrinsics: matrix instructions per input element type, preferred first.
        peak_tflops: dense matrix peak per input element type.
        bandwidth_gbs: device memory bandwidth.
    """

    name: str
    backend: str
    driver: str
    arch: str
    family: str
    description: str
    compute_units: int = 0
    subgroup_size: int = 0
    lds_bytes: int = 0
    registers: int = 0
    max_waves_per_cu: int = 0
    intrinsics: dict[str, tuple[Intrinsic, ...]] = field(default_factory=dict, compare=False)
    peak_tflops: dict[str, float] = field(default_factory=dict, compare=False)
    bandwidth_gbs: float = 0.0
    extra_flags: tuple[str, ...] = field(default=())
    tile_policy: TilePolicy = TilePolicy()

    @property
    def is_gpu(self) -> bool:
        return self.family != "cpu"

    def intrinsic(self, dtype: str, name: str) -> Intrinsic | None:
        """The matrix instruction ``name`` for inputs of ``dtype``, or None if this target has none such."""
        return next((i for i in self.intrinsics.get(dtype, ()) if i.name == name), None)

    def iree_flags(self) -> list[str]:
        """The IREE compiler flags selecting this target (verified against iree-base-compiler 3.13)."""
        if self.backend == "local":
            flags = [
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host",
            ]
        elif self.backend == "hip":
            # 3.13 spells the chip flag --iree-rocm-target (not --iree-hip-target): DESIGN.md.
            flags = ["--iree-hal-target-device=hip", f"--iree-rocm-target={self.arch}"]
        else:
            flags = ["--iree-hal-target-device=cuda", f"--iree-cuda-target={self.arch}"]
        return flags + list(self.extra_flags)

    def roofline_seconds(self, flops: float, bytes_moved: float, dtype: str = "f16") -> float:
        """max(flops / peak, bytes / bandwidth): the least time the hardware allows."""
        return max(flops / (self.peak_tflops[dtype] * 1e12), bytes_moved / (self.bandwidth_gbs * 1e9))


def _amd(name: str, family: str, desc: str, cus: int, wave: int, lds: int, regs: int, waves: int,
         intr: dict, peak: dict, bw: float) -> Target:  # fmt: skip
    policy = _RDNA_POLICY if family == "rdna" else TilePolicy()
    return Target(name, "hip", "hip", name, family, desc, cus, wave, lds, regs, waves, intr, peak, bw,
                  tile_policy=policy)  # fmt: skip


def _nv(name: str, desc: str, sms: int, smem: int, peak: dict, bw: float) -> Target:
    # 255 registers per thread and 64 resident warps per SM on sm_80/86/89 (CUDA C Programming Guide,
    # "Technical Specifications per Compute Capability"; sm_86/89: 48 warps).
    warps = 64 if name == "sm_80" else 48
    return Target(name, "cuda", "cuda", name, "nvidia", desc, sms, 32, smem, 255, warps, _SM80, peak, bw)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("host", "local", "local-task", "host", "cpu", "this machine's CPU (llvm-cpu)"),
        # AMD numbers: the Instinct datasheets (MI250X: per GCD, the unit one HIP device is; MI300X; MI355X),
        # the CDNA3/CDNA4 ISA guides (LDS 64 KiB; 160 KiB on gfx950; 512 VGPR+AGPR per lane; 8 waves/SIMD
        # x 4 SIMDs on gfx942, 8 x 4 on gfx90a), the RDNA3/RDNA4 ISA guides (LDS 64 KiB per workgroup,
        # 1536 VGPRs/SIMD in wave32 -> 256 per lane per wave; 16 waves/SIMD x 2 SIMDs per CU).
        _amd(
            "gfx90a",
            "cdna",
            "CDNA2: MI250X (one GCD), MI210",
            110,
            64,
            65536,
            512,
            32,
            _CDNA2_3,
            {"f16": 191.5, "bf16": 191.5, "f32": 47.9},
            1638,
        ),
        _amd(
            "gfx942",
            "cdna",
            "CDNA3: MI300X, MI325X",
            304,
            64,
            65536,
            512,
            32,
            _CDNA2_3,
            {"f16": 1307.4, "bf16": 1307.4, "f32": 163.4},
            5300,
        ),
        _amd(
            "gfx950",
            "cdna",
            "CDNA4: MI355X",
            256,
            64,
            163840,
            512,
            32,
            _CDNA4,
            {"f16": 2516.6, "bf16": 2516.6, "f32": 157.3},
            8000,
        ),
        _amd(
            "gfx1100",
            "rdna",
            "RDNA3: RX 7900 XTX",
            96,
            32,
            65536,
            256,
            32,
            _RDNA3,
            {"f16": 122.8, "bf16": 122.8, "f32": 61.4},
            960,
        ),
        _amd(
            "gfx1151",
            "rdna",
            "RDNA3.5: Strix Halo (Radeon 8060S)",
            40,
            32,
            65536,
            256,
            32,
            _RDNA3,
            {"f16": 59.4, "bf16": 59.4, "f32": 29.7},
            256,
        ),
        _amd(
            "gfx1201",
            "rdna",
            "RDNA4: RX 9070 XT",
            64,
            32,
            65536,
            256,
            32,
            _RDNA4,
            {"f16": 194.6, "bf16": 194.6, "f32": 48.7},
            640,
        ),
        # NVIDIA numbers: A100 SXM 80GB datasheet (312 TFLOP/s dense f16, 2039 GB/s), 164 KiB shared per
        # block (CUDA guide, cc 8.0); RTX 3090 (sm_86), RTX 4090 (sm_89) datasheets.
        _nv(
            "sm_80",
            "Ampere A100; its PTX also runs on H100/H200",
            108,
            167936,
            {"f16": 312.0, "bf16": 312.0, "f32": 19.5},
            2039,
        ),
        _nv("sm_86", "Ampere RTX 3090, A10", 82, 101376, {"f16": 71.0, "bf16": 71.0, "f32": 35.6}, 936),
        _nv("sm_89", "Ada RTX 4090, L4, L40", 128, 101376, {"f16": 165.2, "bf16": 165.2, "f32": 82.6}, 1008),
    )
}

# The Hopper parts that run our sm_80 code (through the driver's PTX JIT). mma.sync, the instruction
# sm_80 code uses, peaks at 643 TFLOP/s on an H200 in a register-only loop and copies move 4.25 TB/s
# (measured, ../shared/DESIGN.md); datasheets: H100 SXM 132 SMs 3.35 TB/s, H200 132 SMs 4.8 TB/s.
RUNS_SM80 = {
    "H100": Target("H100", "cuda", "cuda", "sm_80", "nvidia", "H100 SXM running sm_80 PTX", 132, 32, 232448,
                   255, 64, _SM80, {"f16": 643.0, "bf16": 643.0, "f32": 67.0}, 3350),
    "H200": Target("H200", "cuda", "cuda", "sm_80", "nvidia", "H200 running sm_80 PTX", 132, 32, 232448,
                   255, 64, _SM80, {"f16": 643.0, "bf16": 643.0, "f32": 67.0}, 4250),
}  # fmt: skip


def get_target(name: str) -> Target:
    """Look a target up by name.

    Raises:
        ValueError: unknown target, listing the known ones.
    """
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target: unknown target {name!r}; known: {', '.join(TARGETS)}") from None
