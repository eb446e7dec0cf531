"""The report's strategy column names our explicit kernels and their tiling, read back from the IR's plan."""

from __future__ import annotations

import json
from dataclasses import asdict

from convbw_mlir.build.contenders import _config_of, build_contender
from convbw_mlir.measure.report import main as report_main
from convbw_mlir.measure.report import strategy_cell
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem

# Channels-last f16 on sm_80: the plan's own choice is the explicit kernel (docs/decisions.md#explicit-by-default).
EXPLICIT = ConvBwdWeightProblem.from_ck("2 1 8 64 64 3 3 8 8 1 1 1 1 1 1 1 1").with_(dtype="f16", dw_dtype="f16")


def _results(configs: dict[str, dict]) -> dict:
    """Results as the runner writes them: the manifest's config copied onto each convbw result."""
    rows = [
        {"name": name, "key": f"{name}.f16", "flops": EXPLICIT.flops, "bytes": EXPLICIT.min_bytes,
         "reduction_length": EXPLICIT.gemm[3],
         "contenders": {"convbw": {"status": "ok", "median_s": 1e-4, "config": cfg},
                        "iree_direct": {"status": "ok", "median_s": 2e-4}}}
        for name, cfg in configs.items()
    ]  # fmt: skip
    return {"device": "H100", "target": "sm_80", "iree_version": "3.13.0", "date": "2026-11-25", "problems": rows}


def test_an_explicit_kernel_s_config_is_its_plan_s_strategy_and_tile():
    plan = decide(EXPLICIT, "sm_80")
    assert plan.strategy == "explicit"
    text, _ = build_contender(EXPLICIT, "convbw", "sm_80")
    assert _config_of(text) == {"k_batch": plan.k_batch, "strategy": "explicit", **asdict(plan.tile)}
    streamk = EXPLICIT.with_(layout="NGCHW/GKCYX/NGKHW")
    text, _ = build_contender(streamk, "convbw:strategy=explicit,streamk=auto", "sm_80")
    assert _config_of(text)["streamk"] == asdict(decide(streamk, "sm_80", strategy="explicit", streamk="auto").streamk)


def test_a_merged_kernel_s_config_and_strategy_cell_name_its_groups_a_gemm():
    thin = ConvBwdWeightProblem.from_ck("2 4 2 4 4 3 3 6 7 1 1 1 1 1 1 1 1")
    text, _ = build_contender(thin, "convbw:strategy=explicit,merge_groups=4", "sm_80")
    cfg = _config_of(text)
    assert cfg["merge"] == 4 and strategy_cell(cfg).endswith(", 4 groups merged")


def test_report_strategy_column_prints_explicit_and_the_tiling_not_a_dash(tmp_path):
    explicit, _ = build_contender(EXPLICIT, "convbw", "sm_80")
    codegen, _ = build_contender(EXPLICIT, "convbw:strategy=codegen", "sm_80")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results({"explicit": _config_of(explicit), "codegen": _config_of(codegen)})))
    assert report_main([str(path)]) == 0
    table = path.with_suffix(".md").read_text().split("## Accuracy")[0]  # the timing table, before accuracy's
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    t = decide(EXPLICIT, "sm_80").tile
    want = f"| explicit {t.m}x{t.n}x{t.k} ({t.subgroups_m}x{t.subgroups_n} subgroups, {t.stages} stages) |"
    assert rows["| explicit.f16"].endswith(want)
    assert rows["| codegen.f16"].split(" | ")[-1].startswith("mma ")


def test_strategy_cell_names_streamk_and_producer_warps_and_leaves_a_dash_only_without_a_strategy():
    tile = {"m": 128, "n": 128, "k": 64, "subgroups_m": 2, "subgroups_n": 2, "stages": 3}
    cell = strategy_cell({"strategy": "explicit", **tile, "streamk": {"workgroups": 132, "fixup": "tree"}})
    assert cell == "explicit 128x128x64 (2x2 subgroups, 3 stages), StreamK 132 workgroups tree"
    assert strategy_cell({"strategy": "explicit", **tile, "producers": 2}).endswith(", 2 producer warps")
    assert strategy_cell({"strategy": "iree", "k_batch": 4}) == "iree"
    assert strategy_cell({"k_batch": 1}) == "-"
