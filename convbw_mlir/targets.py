"""The targets convbw-mlir compiles for: IREE flags, runtime driver and the hardware facts the GPU
passes plan with. Importable without the IREE compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TARGETS", "Target", "get_target"]


@dataclass(frozen=True)
class Target:
    """One compile target.

    Attributes:
        name: what users type (``host``, ``gfx942``, ``sm_80``...).
        backend: IREE HAL target device (``local``, ``hip``, ``cuda``).
        driver: IREE runtime driver that runs its vmfb (``local-task``, ``hip``, ``cuda``).
        arch: the chip name IREE's backend takes (``gfx942``, ``sm_80``; ``host`` for the CPU).
        family: ``cpu``, ``cdna``, ``rdna`` or ``nvidia``.
        description: the products it means.
    """

    name: str
    backend: str
    driver: str
    arch: str
    family: str
    description: str
    extra_flags: tuple[str, ...] = field(default=())

    @property
    def is_gpu(self) -> bool:
        return self.family != "cpu"

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


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("host", "local", "local-task", "host", "cpu", "this machine's CPU (llvm-cpu)"),
        Target("gfx90a", "hip", "hip", "gfx90a", "cdna", "CDNA2: MI210, MI250X"),
        Target("gfx942", "hip", "hip", "gfx942", "cdna", "CDNA3: MI300X, MI325X"),
        Target("gfx950", "hip", "hip", "gfx950", "cdna", "CDNA4: MI355X"),
        Target("gfx1100", "hip", "hip", "gfx1100", "rdna", "RDNA3: RX 7900 XTX"),
        Target("gfx1151", "hip", "hip", "gfx1151", "rdna", "RDNA3.5: Strix Halo"),
        Target("gfx1201", "hip", "hip", "gfx1201", "rdna", "RDNA4: RX 9070 XT"),
        Target("sm_80", "cuda", "cuda", "sm_80", "nvidia", "Ampere A100; its PTX also runs on H100/H200"),
        Target("sm_86", "cuda", "cuda", "sm_86", "nvidia", "Ampere RTX 30xx, A10"),
        Target("sm_89", "cuda", "cuda", "sm_89", "nvidia", "Ada RTX 40xx, L4, L40"),
    )
}


def get_target(name: str) -> Target:
    """Look a target up by name.

    Raises:
        ValueError: unknown target, listing the known ones.
    """
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target: unknown target {name!r}; known: {', '.join(TARGETS)}") from None
