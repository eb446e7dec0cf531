"""The targets convbw-mlir compiles for: IREE flags, runtime driver and the hardware facts the GPU
passes, the ISA report and the ISA matrix read. Importable without the IREE compiler.

This table is the one place a target is described: adding a chip means adding one entry to
:data:`TARGETS` (its family, wave size, LDS, register file, matrix intrinsics with their ISA mnemonics,
the ISA file IREE dumps for it, and its tile policy); nothing else lists targets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = [
    "FAMILIES",
    "RUNS_SM80",
    "TARGETS",
    "Intrinsic",
    "Target",
    "TilePolicy",
    "get_target",
    "gpu_targets",
    "resolve",
]

FAMILIES = ("cpu", "cdna", "rdna", "nvidia")


@dataclass(frozen=True)
class Intrinsic:
    """A matrix-core instruction as IREE names it (``#iree_gpu.mma_layout<NAME>``), with its M x N x K
    and ``mnemonic``: how it reads in the dumped ISA (AMD assembly; on NVIDIA the NVVM intrinsic of the
    ``.optimized.ll``, since IREE 3.13 dumps no PTX)."""

    name: str
    m: int
    n: int
    k: int
    mnemonic: str = ""


@dataclass(frozen=True)
class TilePolicy:
    """How plans tile on a target family (each choice measured: docs/decisions.md)."""

    gemm: str = "iree"  # plain GEMMs (1x1): "mma" = our tile, "iree" = IREE's own config
    grouped: str = "iree"  # grouped convolutions (G > 1): "mma" or "iree"
    narrow_n: bool = True  # halve the N tile while the split grid leaves compute units idle
    acc_per_lane: tuple[tuple[str, int], ...] = ()  # cap of f32 accumulators a lane, by input type


# RDNA: IREE's tiles spill where ours do not, and so do a halved N or more accumulators a lane:
# docs/decisions.md#strategy-choice and #rdna-accumulators.
_RDNA_POLICY = TilePolicy(gemm="mma", grouped="mma", narrow_n=False, acc_per_lane=(("f16", 64), ("bf16", 32)))


def _mma(prefix: str, dtype: str, shapes: tuple[tuple[int, int, int], ...], mnemonic: str) -> tuple[Intrinsic, ...]:
    """Intrinsics ``{prefix}_{m}x{n}x{k}_{DTYPE}``; ``mnemonic`` is formatted with m, n, k."""
    return tuple(
        Intrinsic(f"{prefix}_{m}x{n}x{k}_{dtype.upper()}", m, n, k, mnemonic.format(m=m, n=n, k=k))
        for m, n, k in shapes
    )


# IREE's intrinsic names: compiler/src/iree/compiler/Codegen/Dialect/GPU/IR/IREEGPUEnums.td (MMAIntrinsic).
# Mnemonics as LLVM prints them (checked against the committed ISA matrices): gfx90a in the pre-gfx940
# spelling (v_mfma_f32_16x16x16f16, bf16 "_1k" forms), gfx940+ with an underscore before the type.
_F16_SHAPES = ((16, 16, 16), (32, 32, 8))  # gfx90a / gfx942: 16x16x16 and 32x32x8, 16x16x4 for f32
_CDNA2 = {
    "f16": _mma("MFMA_F32", "f16", _F16_SHAPES, "v_mfma_f32_{m}x{n}x{k}f16"),
    "bf16": _mma("MFMA_F32", "bf16", _F16_SHAPES, "v_mfma_f32_{m}x{n}x{k}bf16_1k"),
    "f32": _mma("MFMA_F32", "f32", ((16, 16, 4),), "v_mfma_f32_{m}x{n}x{k}f32"),
}
_CDNA3 = {
    t: _mma("MFMA_F32", t, _F16_SHAPES if t != "f32" else ((16, 16, 4),), "v_mfma_f32_{m}x{n}x{k}_" + t)
    for t in ("f16", "bf16", "f32")
}
_CDNA4 = {  # gfx950 doubles K: 16x16x32 and 32x32x16 (CDNA4 ISA guide, "MFMA" tables)
    t: _mma("MFMA_F32", t, ((16, 16, 32), (32, 32, 16), (16, 16, 16)) if t != "f32" else ((16, 16, 4),),
            "v_mfma_f32_{m}x{n}x{k}_" + t)
    for t in ("f16", "bf16", "f32")
}  # fmt: skip
# gfx11 and gfx12 print the same WMMA mnemonic; their operand forms differ (16 vs 8 f16 a lane).
_RDNA3 = {t: _mma("WMMAR3_F32", t, ((16, 16, 16),), "v_wmma_f32_{m}x{n}x{k}_" + t) for t in ("f16", "bf16")}
_RDNA4 = {t: _mma("WMMAR4_F32", t, ((16, 16, 16),), "v_wmma_f32_{m}x{n}x{k}_" + t) for t in ("f16", "bf16")}
_SM80 = {  # the NVVM intrinsics are named after the accumulator types (f16 in, f32 out: .f32.f32)
    "f16": _mma("NV_MMA_SYNC_F32", "f16", ((16, 8, 16),), "llvm.nvvm.mma.m{m}n{n}k{k}.row.col.f32.f32"),
    "bf16": _mma("NV_MMA_SYNC_F32", "bf16", ((16, 8, 16),), "llvm.nvvm.mma.m{m}n{n}k{k}.row.col.bf16"),
}


@dataclass(frozen=True)
class Target:
    """One compile target and the hardware facts the GPU passes plan with.

    Attributes:
        name: what users type (``host``, ``gfx942``, ``sm_80``...).
        backend: IREE HAL target device (``local``, ``hip``, ``cuda``).
        driver: IREE runtime driver that runs its vmfb (``local-task``, ``hip``, ``cuda``).
        arch: the chip name IREE's backend takes (``gfx942``, ``sm_80``; ``host`` for the CPU).
        family: one of :data:`FAMILIES`: ``cpu``, ``cdna``, ``rdna`` or ``nvidia``.
        description: the products it means (the numbers below are for the first one named).
        compute_units: CUs (AMD) or SMs (NVIDIA).
        subgroup_size: wave / warp size the kernels are compiled for.
        lds_bytes: LDS (shared memory) one workgroup may use.
        registers: 32-bit registers one lane of one wave may use (AMD CDNA: VGPRs + AGPRs).
        max_waves_per_cu: resident waves per CU/SM at full occupancy (``simds_per_cu * max_waves_per_simd``).
        intrinsics: matrix instructions per input element type, preferred first.
        peak_tflops: dense matrix peak per input element type.
        bandwidth_gbs: device memory bandwidth.
        extra_flags: more IREE flags this target always takes.
        lds_per_cu: LDS the resident workgroups of one CU/SM share (the LDS occupancy limit).
        simds_per_cu: SIMDs per CU (AMD) or scheduler partitions per SM (NVIDIA).
        max_waves_per_simd: resident waves per SIMD at most.
        register_file: 32-bit registers per SIMD lane, shared by the waves resident on that SIMD.
        register_granule: a wave's registers are allocated in multiples of this (per lane).
        isa_suffix: the file of IREE's dumped intermediates that holds the machine-level text
            (``.rocmasm`` AMD assembly; ``.optimized.ll`` NVPTX LLVM IR, as 3.13 dumps no PTX; ``.s`` x86).
        tile_policy: how plans tile on this target (:class:`TilePolicy`).
        target_info: a hand-written ``#iree_gpu.target<...>`` for a chip IREE has no flag value for
            (sm_90a in 3.13): the module then carries ``hal.device.targets`` (:meth:`device_targets`)
            and takes no target flags.
        wgmma_n: the N of the ``wgmma.mma_async`` m64nNk16 shapes (sm_90a; empty elsewhere).
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
    lds_per_cu: int = 0
    simds_per_cu: int = 0
    max_waves_per_simd: int = 0
    register_file: int = 0
    register_granule: int = 0
    isa_suffix: str = ""
    tile_policy: TilePolicy = TilePolicy()
    target_info: str = ""
    wgmma_n: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # A new entry with a missing or inconsistent fact fails at import, not as a wrong plan later.
        where = f"target {self.name!r}"
        if self.family not in FAMILIES:
            raise ValueError(f"{where}: family: {self.family!r} is not one of {', '.join(FAMILIES)}")
        if not self.isa_suffix:
            raise ValueError(f"{where}: isa_suffix: {self.isa_suffix!r} is empty")
        for policy_field in ("gemm", "grouped"):
            value = getattr(self.tile_policy, policy_field)
            if value not in ("mma", "iree"):
                raise ValueError(f"{where}: tile_policy.{policy_field}: {value!r} is not 'mma' or 'iree'")
        if not self.is_gpu:
            return
        for name in ("compute_units", "subgroup_size", "lds_bytes", "registers", "lds_per_cu", "simds_per_cu",
                     "max_waves_per_simd", "register_file", "register_granule"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{where}: {name}: {getattr(self, name)!r} must be positive on a GPU")
        if self.lds_bytes > self.lds_per_cu:
            raise ValueError(f"{where}: lds_bytes: {self.lds_bytes} exceeds lds_per_cu {self.lds_per_cu}")
        if self.max_waves_per_cu != self.simds_per_cu * self.max_waves_per_simd:
            raise ValueError(
                f"{where}: max_waves_per_cu: {self.max_waves_per_cu} != simds_per_cu {self.simds_per_cu}"
                f" x max_waves_per_simd {self.max_waves_per_simd}"
            )
        unnamed = [i.name for intrs in self.intrinsics.values() for i in intrs if not i.mnemonic]
        if unnamed:
            raise ValueError(f"{where}: intrinsics: {', '.join(unnamed)} carry no ISA mnemonic")

    @property
    def is_gpu(self) -> bool:
        return self.family != "cpu"

    @property
    def registers_per_cu(self) -> int:
        """32-bit registers a CU/SM holds: ``register_file`` a SIMD lane x lanes x SIMDs (sm_80: 65,536)."""
        return self.register_file * self.subgroup_size * self.simds_per_cu

    def intrinsic(self, dtype: str, name: str) -> Intrinsic | None:
        """The matrix instruction ``name`` for inputs of ``dtype``, or None if this target has none such."""
        return next((i for i in self.intrinsics.get(dtype, ()) if i.name == name), None)

    def mnemonics(self, dtype: str) -> frozenset[str]:
        """The ISA mnemonics of this target's matrix instructions for inputs of ``dtype``."""
        return frozenset(i.mnemonic for i in self.intrinsics.get(dtype, ()))

    def device_targets(self) -> str:
        """The ``hal.device.targets`` module attribute of a hand-written target ('' for a flag target)."""
        if not self.target_info:
            return ""
        return (f'[#hal.device.target<"{self.backend}", [#hal.executable.target<"{self.backend}", '
                f'"cuda-nvptx-fb", {{iree_codegen.target_info = {self.target_info}}}>]> : !hal.device]')  # fmt: skip

    def iree_flags(self) -> list[str]:
        """The IREE compiler flags selecting this target (verified against iree-base-compiler 3.13)."""
        if self.target_info:  # the module's hal.device.targets selects it (compile_module attaches it)
            return list(self.extra_flags)
        if self.backend == "local":
            flags = [
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host",
            ]
        elif self.backend == "hip":
            # 3.13 spells the chip flag --iree-rocm-target (not --iree-hip-target).
            flags = ["--iree-hal-target-device=hip", f"--iree-rocm-target={self.arch}"]
        else:
            flags = ["--iree-hal-target-device=cuda", f"--iree-cuda-target={self.arch}"]
        return flags + list(self.extra_flags)

    def roofline_seconds(self, flops: float, bytes_moved: float, dtype: str = "f16") -> float:
        """max(flops / peak, bytes / bandwidth): the least time the hardware allows."""
        return max(flops / (self.peak_tflops[dtype] * 1e12), bytes_moved / (self.bandwidth_gbs * 1e9))


def _cdna(name: str, desc: str, cus: int, lds: int, intr: dict, peak: dict, bw: float) -> Target:
    # CDNA2/3/4 ISA guides: wave64; 4 SIMDs a CU, up to 8 waves a SIMD; 512 registers a lane, VGPRs and
    # AGPRs unified, allocated in granules of 8; LDS per workgroup = LDS per CU (64 KiB; gfx950 160 KiB).
    return Target(name, "hip", "hip", name, "cdna", desc, cus, 64, lds, 512, 4 * 8, intr, peak, bw,
                  lds_per_cu=lds, simds_per_cu=4, max_waves_per_simd=8, register_file=512, register_granule=8,
                  isa_suffix=".rocmasm")  # fmt: skip


def _rdna(name: str, desc: str, cus: int, intr: dict, peak: dict, bw: float) -> Target:
    # RDNA3/RDNA4 ISA guides: wave32; 2 SIMDs a CU, up to 16 waves a SIMD; 64 KiB LDS a workgroup, 128 KiB a
    # WGP of 2 CUs (IREE compiles in WGP mode: the same 64 KiB per 2 SIMDs); 256 VGPRs a wave. The chips here
    # (gfx1100/1151/1200/1201) have the 1.5x register file: 1536 VGPRs a SIMD lane in wave32, allocated in
    # granules of 24 (LLVM AMDGPU feature "allocate1_5xvgprs": "50% more physical VGPRs and 50% larger
    # allocation granule"; ROCt/hsakmt: 384 KiB of VGPRs a CU on gfx1100/1101/1200/1201).
    return Target(name, "hip", "hip", name, "rdna", desc, cus, 32, 65536, 256, 2 * 16, intr, peak, bw,
                  lds_per_cu=65536, simds_per_cu=2, max_waves_per_simd=16, register_file=1536,
                  register_granule=24, isa_suffix=".rocmasm", tile_policy=_RDNA_POLICY)  # fmt: skip


def _nv(name: str, desc: str, sms: int, smem: int, smem_sm: int, warps: int, peak: dict, bw: float,
        arch: str = "") -> Target:  # fmt: skip
    # CUDA C Programming Guide, "Technical Specifications per Compute Capability": 64 K 32-bit registers an
    # SM in 4 partitions (512 a lane of a partition), 255 a thread, allocated 256 a warp (8 a lane).
    return Target(name, "cuda", "cuda", arch or name, "nvidia", desc, sms, 32, smem, 255, warps, _SM80, peak, bw,
                  lds_per_cu=smem_sm, simds_per_cu=4, max_waves_per_simd=warps // 4, register_file=512,
                  register_granule=8, isa_suffix=".optimized.ll")  # fmt: skip


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("host", "local", "local-task", "host", "cpu", "this machine's CPU (llvm-cpu)", isa_suffix=".s"),
        # AMD numbers: the Instinct datasheets (MI250X: per GCD, the unit one HIP device is; MI300X; MI355X)
        # and the Radeon product pages (peak = dense f16 matrix rate, bandwidth = memory bus x data rate).
        _cdna("gfx90a", "CDNA2: MI250X (one GCD), MI210", 110, 65536, _CDNA2,
              {"f16": 191.5, "bf16": 191.5, "f32": 47.9}, 1638),
        _cdna("gfx942", "CDNA3: MI300X, MI325X", 304, 65536, _CDNA3,
              {"f16": 1307.4, "bf16": 1307.4, "f32": 163.4}, 5300),
        _cdna("gfx950", "CDNA4: MI355X", 256, 163840, _CDNA4, {"f16": 2516.6, "bf16": 2516.6, "f32": 157.3}, 8000),
        _rdna("gfx1100", "RDNA3: RX 7900 XTX", 96, _RDNA3, {"f16": 122.8, "bf16": 122.8, "f32": 61.4}, 960),
        _rdna("gfx1151", "RDNA3.5: Strix Halo (Radeon 8060S)", 40, _RDNA3,
              {"f16": 59.4, "bf16": 59.4, "f32": 29.7}, 256),
        # RX 9060 XT (AMD product page, Computex 2025): 32 CUs, boost 3.13 GHz, 821 INT4 sparse TOPS
        # (= 8 x the dense f16 matrix rate: 32 CUs x 1024 FLOP/clk x 3.13 GHz = 102.6 TFLOP/s), 128-bit
        # GDDR6 at 20 Gbps = 320 GB/s; f32 = 32 x 64 lanes x 2 (dual issue) x 2 x 3.13 GHz.
        _rdna("gfx1200", "RDNA4: RX 9060 XT", 32, _RDNA4, {"f16": 102.6, "bf16": 102.6, "f32": 25.6}, 320),
        _rdna("gfx1201", "RDNA4: RX 9070 XT", 64, _RDNA4, {"f16": 194.6, "bf16": 194.6, "f32": 48.7}, 640),
        # NVIDIA numbers: A100 SXM 80GB datasheet (312 TFLOP/s dense f16, 2039 GB/s); shared memory a block
        # and an SM, resident warps an SM per the CUDA guide (cc 8.0: 163/164 KiB, 64 warps; cc 8.6/8.9:
        # 99/100 KiB, 48 warps); RTX 3090 (sm_86), RTX 4090 (sm_89) datasheets.
        _nv("sm_80", "Ampere A100; its PTX also runs on H100/H200", 108, 166912, 167936, 64,
            {"f16": 312.0, "bf16": 312.0, "f32": 19.5}, 2039),
        _nv("sm_86", "Ampere RTX 3090, A10", 82, 101376, 102400, 48, {"f16": 71.0, "bf16": 71.0, "f32": 35.6}, 936),
        _nv("sm_89", "Ada RTX 4090, L4, L40", 128, 101376, 102400, 48,
            {"f16": 165.2, "bf16": 165.2, "f32": 82.6}, 1008),
    )
}  # fmt: skip

# The Hopper parts that run our sm_80 code (through the driver's PTX JIT); the mma.sync peak and copy
# bandwidth are measured (docs/decisions.md#sm80-on-hopper); datasheets: H100 SXM 132 SMs 3.35 TB/s;
# CUDA guide cc 9.0: 227 KiB shared memory a block, 228 KiB an SM, 64 warps an SM.
RUNS_SM80 = {
    "H100": _nv("H100", "H100 SXM running sm_80 PTX", 132, 232448, 233472, 64,
                {"f16": 643.0, "bf16": 643.0, "f32": 67.0}, 3350, arch="sm_80"),
    "H200": _nv("H200", "H200 running sm_80 PTX", 132, 232448, 233472, 64,
                {"f16": 643.0, "bf16": 643.0, "f32": 67.0}, 4250, arch="sm_80"),
}  # fmt: skip


# sm_90a (Hopper's arch-specific PTX: wgmma, setmaxnreg): IREE 3.13 has no flag value for it, but takes
# this target written out by hand (docs/iree-facts.md "sm_90a: a target written out by hand"): sm_80's fields,
# PTX 8.0, and Hopper's 227 KiB of shared memory a block (CUDA guide, cc 9.0). H100 SXM datasheet: 132 SMs,
# 989.4 TFLOP/s dense f16/bf16 (wgmma), 3.35 TB/s. wgmma N: 8..256 in steps of 8 (PTX ISA "wgmma.mma_async").
_SM90A_INFO = (
    '#iree_gpu.target<arch = "sm_90a", features = "+ptx80", wgp = <compute = fp64|fp32|fp16|int64|int32|int16|int8, '
    "storage = b64|b32|b16|b8, subgroup = shuffle|arithmetic, dot = dp4xi8toi32, mma = [<NV_MMA_SYNC_F32_16x8x16_F16>, "
    "<NV_MMA_SYNC_F16_16x8x16_F16>, <NV_MMA_SYNC_F32_16x8x16_BF16>, <NV_WMMA_F32_16x16x16_F16>, "
    "<NV_WMMA_F16_16x16x16_F16>], subgroup_size_choices = [32], max_workgroup_sizes = [1024, 1024, 1024], "
    "max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 232448, "
    "max_workgroup_counts = [2147483647, 65535, 65535]>>"
)
# The sm_90a conv kernel's wgmma shapes, every tile width its rule may choose (policies/sm90.py TILE_COST and
# NARROW_COST; tests/test_sm90_product.py holds the two together), after mma.sync: IREE's codegen plans take
# the first (mma.sync); only our kernel's plans name these (its tile marks the kernel).
_SM90A_INTRINSICS = {
    t: (*_SM80[t], *_mma("NV_WGMMA_F32", t, ((64, n, 16) for n in (64, 128, 192, 256)),
                         "wgmma.mma_async.sync.aligned.m{m}n{n}k{k}.f32." + t))
    for t in ("f16", "bf16")
}  # fmt: skip
# The fp8 GEMM's k32 wgmmas (policies/sm90_fp8.py), keyed by x's type (B): A (dy^T) either fp8 type.
_SM90A_INTRINSICS.update({
    x: tuple(Intrinsic(f"NV_WGMMA_F32_64x{n}x32_{dy.upper()}_{x.upper()}", 64, n, 32,
                       f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{dy}.{x}")
             for dy in ("e4m3", "e5m2") for n in (64, 128))
    for x in ("e4m3", "e5m2")
})  # fmt: skip
TARGETS["sm_90a"] = dataclasses.replace(
    _nv("sm_90a", "Hopper H100/H200 (wgmma, TMA, setmaxnreg)", 132, 232448, 233472, 64,
        {"f16": 989.4, "bf16": 989.4, "f32": 67.0}, 3350),
    target_info=_SM90A_INFO, wgmma_n=tuple(range(8, 257, 8)), intrinsics=_SM90A_INTRINSICS,
)  # fmt: skip


def gpu_targets() -> list[Target]:
    """The GPU entries of :data:`TARGETS`, in table order (read at call time, so added entries count)."""
    return [t for t in TARGETS.values() if t.is_gpu]


def get_target(name: str) -> Target:
    """Look a target up by name.

    Raises:
        ValueError: unknown target, listing the known ones.
    """
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target: unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def resolve(target: Target | str) -> Target:
    """``target`` itself when it is a :class:`Target` (resolved once, at the top of a compile, and passed
    down), else the target of that name (:func:`get_target`'s error for an unknown one)."""
    return target if isinstance(target, Target) else get_target(target)
