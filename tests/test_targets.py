"""The target table is the one place a target is described: the ISA report, the compiler's intermediates
and the ISA matrix read their facts from it (no IREE compile here; lit/isa compiles)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import bench_script

from convbw_mlir.build.iree import Intermediates
from convbw_mlir.build.isa import parse_rocmasm, report
from convbw_mlir.targets import TARGETS, Intrinsic, TilePolicy, get_target, gpu_targets

ROOT = Path(__file__).resolve().parents[1]

isa_matrix = bench_script("isa_matrix")


def kernel(name: str, vgprs: int, lds: int = 0, mnemonic: str = "v_mfma_f32_16x16x16_f16") -> str:
    """One kernel of a ``.rocmasm`` as IREE dumps it: its body under a label, then its descriptor."""
    return f"""\t.text
{name}:
\t{mnemonic} a[0:3], v[0:1], v[2:3], a[0:3]
\ts_endpgm
\t.amdhsa_kernel {name}
\t\t.amdhsa_group_segment_fixed_size {lds}
\t\t.amdhsa_private_segment_fixed_size 0
\t\t.amdhsa_next_free_vgpr {vgprs}
\t\t.amdhsa_next_free_sgpr 24
\t.end_amdhsa_kernel
"""


def metadata(workgroups: dict[str, int]) -> str:
    """The code object metadata: one amdhsa.kernels entry per kernel, keys in LLVM's (alphabetical) order."""
    entries = "".join(
        f"""  - .args:
      - .address_space:  global
        .name:           arg0
        .size:           8
    .group_segment_fixed_size: 0
    .max_flat_workgroup_size: {wg}
    .name:           {name}
    .wavefront_size: 32
"""
        for name, wg in workgroups.items()
    )
    return f"\t.amdgpu_metadata\n---\namdhsa.kernels:\n{entries}amdhsa.version:\n  - 1\n...\n\t.end_amdgpu_metadata\n"


def rocmasm(vgprs: int, lds: int = 0, workgroup: int = 256, mnemonic: str = "v_mfma_f32_16x16x16_f16") -> str:
    """A one-kernel ``.rocmasm``."""
    return kernel("conv_k", vgprs, lds, mnemonic) + metadata({"conv_k": workgroup})


@pytest.fixture
def made_up(monkeypatch: pytest.MonkeyPatch):
    """A CDNA chip that exists only in this test: gfx942 with another name and other limits."""
    target = dataclasses.replace(
        TARGETS["gfx942"],
        name="mi999",
        description="made up",
        register_file=1024,
        max_waves_per_simd=10,
        max_waves_per_cu=40,
        lds_per_cu=131072,
    )
    monkeypatch.setitem(TARGETS, "mi999", target)
    return target


def test_made_up_target_in_the_table_sets_the_isa_report_limits(made_up):
    files = {"k.rocmasm": rocmasm(vgprs=128, lds=16384, workgroup=256)}
    # gfx942's own limits: 512 // 128 = 4 waves by registers, (64 KiB // 16 KiB) x 4 waves / 4 SIMDs by LDS.
    assert report(files, "gfx942").main.occupancy == 4
    # The copy's: 1024 // 128 = 8 by registers, (128 KiB // 16 KiB) x 4 / 4 = 8 by LDS, at most 10 waves.
    k = report(files, "mi999").main
    assert (k.occupancy, k.mma) == (8, {"v_mfma_f32_16x16x16_f16": 1})
    assert Intermediates("mi999", files | {"k.optimized.ll": "nvptx"}).isa == files["k.rocmasm"]


def test_made_up_target_in_the_table_joins_the_isa_matrix(made_up, tmp_path):
    assert "mi999" in isa_matrix.matrix_targets()
    assert isa_matrix.matrix_targets("mi999,gfx1200") == ["mi999", "gfx1200"]

    def row(name: str, mnemonic: str) -> dict:
        ours = {"ok": True, "mma": {mnemonic: 8}, "mma_count": 8, "scratch": 0, "occupancy": 4, "k_batch": 1,
                "strategy": "mma", "dropped": 0}  # fmt: skip
        return {"name": name, "ck": "", "dtype": "f16", "res": {"mi999/ours": ours, "mi999/iree": {"ok": True}}}

    rows = [row("has_mfma", "v_mfma_f32_16x16x16_f16"), row("has_wmma", "v_wmma_f32_16x16x16_f16")]
    text = isa_matrix.write_tables(rows, ["mi999"], tmp_path / "isa")
    assert "| problem | type | mi999 |" in text
    # The expected mnemonics are the made-up target's own (its gfx942 MFMAs), not a family prefix.
    assert "- has_wmma f16 mi999" in text and "- has_mfma f16 mi999" not in text


def test_matrix_targets_default_to_every_gpu_entry_of_the_table():
    assert isa_matrix.matrix_targets() == [t.name for t in TARGETS.values() if t.is_gpu]
    assert "gfx1200" in isa_matrix.matrix_targets() and "host" not in isa_matrix.matrix_targets()


@pytest.mark.parametrize(
    ("spec", "message"),
    [("gfx9999", "targets: 'gfx9999' is unknown target"), ("host", "targets: 'host' is not a GPU target"),
     (",", "targets: ',' names no target")],
)  # fmt: skip
def test_matrix_targets_reject_unknown_and_cpu_names(spec, message):
    with pytest.raises(ValueError, match=message):
        isa_matrix.matrix_targets(spec)


def test_isa_matrix_cli_bad_target_is_one_line_and_exit_1(capsys, tmp_path):
    # one problem, one type: were the name not checked, this would cost one compile, not the whole matrix
    argv = ["--targets", "gfx9999", "--suite", "seeds", "--limit", "1", "--types", "f16", "--out", str(tmp_path / "m")]
    assert isa_matrix.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: targets: 'gfx9999' is unknown target") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("target", "vgprs", "waves"),
    [
        ("gfx1100", 252, 5),  # 1.5x register file: 252 rounds to 11 granules of 24 = 264; 1536 // 264
        ("gfx1200", 100, 12),  # 100 -> 120; 1536 // 120
        ("gfx1201", 96, 16),  # 96 is 4 granules; 16 waves a SIMD at most
        ("gfx942", 130, 3),  # 130 -> 136 (granules of 8); 512 // 136
    ],
)
def test_vgpr_occupancy_rounds_to_the_targets_allocation_granule(target, vgprs, waves):
    # LLVM AMDGPUBaseInfo getVGPRAllocGranule: 24 in wave32 on the 1.5x-VGPR chips, 8 on gfx90a+.
    (k,) = parse_rocmasm(rocmasm(vgprs=vgprs, workgroup=128), target)
    assert (k.occupancy, k.occupancy_limit) == (waves, "vgpr")


def test_gfx1200_is_an_rdna4_target_with_gfx1201s_wmma():
    t = get_target("gfx1200")
    assert (t.family, t.subgroup_size, t.compute_units, t.lds_bytes, t.isa_suffix) == (
        "rdna",
        32,
        32,
        65536,
        ".rocmasm",
    )
    assert t.intrinsics == TARGETS["gfx1201"].intrinsics
    assert t.intrinsic("f16", "WMMAR4_F32_16x16x16_F16").mnemonic == "v_wmma_f32_16x16x16_f16"
    assert t.tile_policy == TilePolicy(
        gemm="mma", grouped="mma", narrow_n=False, acc_per_lane=(("f16", 64), ("bf16", 32))
    )
    assert [a.split("=")[1] for a in t.iree_flags() if a.startswith("--iree-rocm-target")] == ["gfx1200"]


def test_gfx1200_pipeline_configures_wmmar4():
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.problem import ConvBwdWeightProblem

    retinanet = ConvBwdWeightProblem.from_ck("2 1 2 256 256 3 3 13 13 1 1 1 1 1 1 1 1")
    assert "WMMAR4_F32_16x16x16_F16" in lowered_text(retinanet, for_target("gfx1200"))


def test_intrinsic_mnemonics_match_the_committed_isa_matrix():
    # Each kernel our MMA strategy configured shows one of the target's mnemonics for that type in its ISA.
    results = ("isa_2026-11-22_final.json", "isa_gfx1200_2026-11-23.json")
    rows = [row for name in results for row in json.loads((ROOT / "bench/results" / name).read_text())]
    checked = 0
    for row in rows:
        for key, r in row["res"].items():
            target, flavor = key.split("/")
            if flavor == "ours" and r["ok"] and r["strategy"] == "mma":
                assert TARGETS[target].mnemonics(row["dtype"]) & r["mma"].keys(), (row["name"], key, r["mma"])
                checked += 1
    assert checked == 512  # every MMA-strategy kernel of the two files (80 of them on gfx1200)


def test_plans_tile_as_the_table_says():
    from convbw_mlir.plan import Strategy, decide
    from convbw_mlir.problem import ConvBwdWeightProblem

    grouped = ConvBwdWeightProblem.from_ck("2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1")
    gemm = ConvBwdWeightProblem.from_ck("2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0")
    for t in gpu_targets():
        for problem, policy in ((grouped, t.tile_policy.grouped), (gemm, t.tile_policy.gemm)):
            want = Strategy.MMA if policy == "mma" else Strategy.IREE
            assert decide(problem, t.name, k_batch=1).strategy is want, (t.name, problem.name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"family": "rdna4"}, "family: 'rdna4' is not one of"),
        ({"max_waves_per_cu": 33}, "max_waves_per_cu: 33 != simds_per_cu 4 x max_waves_per_simd 8"),
        ({"register_granule": 0}, "register_granule: 0 must be positive"),
        ({"lds_bytes": 131072}, "lds_bytes: 131072 exceeds lds_per_cu 65536"),
        ({"isa_suffix": ""}, "isa_suffix: '' is empty"),
        ({"tile_policy": TilePolicy(gemm="ours")}, "tile_policy.gemm: 'ours' is not"),
        ({"intrinsics": {"f16": (Intrinsic("MFMA_F32_16x16x16_F16", 16, 16, 16),)}}, "carry no ISA mnemonic"),
    ],
)
def test_inconsistent_table_entry_is_refused_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TARGETS["gfx942"], name="bad", **change)


def test_each_kernel_gets_its_own_workgroup_size_from_the_metadata():
    # IREE lists .max_flat_workgroup_size before .name in each entry: the size after a name is the next kernel's.
    text = kernel("conv_k", 128, lds=16384) + kernel("reduce_k", 16) + metadata({"conv_k": 256, "reduce_k": 64})
    conv, reduce = parse_rocmasm(text, "gfx942")
    assert (conv.workgroup_size, reduce.workgroup_size) == (256, 64)
    # conv: (64 KiB // 16 KiB) workgroups x 4 waves / 4 SIMDs = 4 by LDS, the same as by registers (512 // 128)
    assert (conv.occupancy, conv.occupancy_limit) == (4, "vgpr")
    (lds_bound,) = parse_rocmasm(kernel("conv_k", 64, lds=32768) + metadata({"conv_k": 256}), "gfx942")
    assert (lds_bound.occupancy, lds_bound.occupancy_limit) == (2, "lds")
