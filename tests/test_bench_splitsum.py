"""bench/splitsum.py (pack splitsum: the split sum before and after its own tile, timed): the layers (tail7's whose
plan splits, the two slow sums among them), the stage 2's bytes, the merge of the two builds into one manifest and
the report on fabricated part rows (no compiler, no GPU)."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

ss = bench_script("splitsum")


def test_layers_are_tail7s_split_plans_and_only_the_two_slow_sums_take_the_own_tile():
    got = ss.layers()
    assert {n for n, *_ in got[:2]} == set(ss.SLOW) and all(v.plan.k_batch > 1 for *_, v in got)
    tiled = {n: ss.stage_two(p, v.plan) for n, p, _, v in got if ss.stage_two(p, v.plan)["tile"]}
    assert set(tiled) == set(ss.SLOW)
    assert tiled[ss.SLOW[0]] == {"outputs": 888 * 888, "splits": 2, "bytes": 7_885_440, "tile": (222, 4)}


def _entry(key: str, vmfb: str) -> dict:
    return {"name": key[4:-4], "key": key, "problem": {"dtype": "f16"}, "held_out": False,
            "stage2": {"outputs": 1000, "splits": 2, "bytes": 10_000_000, "tile": (250, 4)},
            "contenders": {"reference": {"ok": False}, "convbw[heuristic]": {"ok": True, "vmfb": vmfb}}}  # fmt: skip


def _manifest(folder, keys) -> None:
    folder.mkdir()
    for i, key in enumerate(keys):
        (folder / f"{key}.v0.vmfb").write_bytes(bytes([i]) + folder.name.encode())
    entries = [_entry(key, f"{key}.v0.vmfb") for key in keys]
    (folder / "manifest.json").write_text(json.dumps({"target": "sm_90a", "problems": entries}))


def test_merge_puts_both_builds_of_a_layer_in_one_manifest_with_their_own_files(tmp_path):
    keys = ["000-a.n32.f16", "001-b.n32.f16"]
    _manifest(tmp_path / "before", keys)
    _manifest(tmp_path / "after", keys)
    assert ss.merge(tmp_path / "before", tmp_path / "after", tmp_path / "out") == 0
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    c = man["problems"][1]["contenders"]
    assert set(c) == {"reference", ss.BEFORE, ss.AFTER} and c[ss.AFTER]["heuristic"] and not c[ss.BEFORE]["heuristic"]
    assert (tmp_path / "out" / c[ss.BEFORE]["vmfb"]).read_bytes() == b"\x01before"
    assert (tmp_path / "out" / c[ss.AFTER]["vmfb"]).read_bytes() == b"\x01after"


def test_merge_refuses_builds_of_other_layers(tmp_path):
    _manifest(tmp_path / "before", ["000-a.n32.f16"])
    _manifest(tmp_path / "after", ["000-b.n32.f16"])
    with pytest.raises(ValueError, match="the layers of .* differ"):
        ss.merge(tmp_path / "before", tmp_path / "after", tmp_path / "out")


SUM = "conv_bwd_weight_dispatch_0_reduction_1000x2_f32"  # IREE's name of the stage-2 dispatch


def _row(us: float, sum_us: float, status: str = "ok") -> dict:
    return {"status": status, "kernel_s": us * 1e-6, "kernel_launch_us": [us - sum_us] * 3,
            "kernel_us_each": {"gemm": us - sum_us, SUM: sum_us}}  # fmt: skip


def test_report_gives_the_stage_two_apart_by_name_and_its_bandwidth_and_never_counts_a_wrong_kernel():
    man = {"problems": [_entry("000-a.n32.f16", "x"), _entry("001-b.n32.f16", "y")]}
    rows = [{"name": "a.n32", "key": "000-a.n32.f16", "contenders": {ss.BEFORE: _row(30.0, 14.0),
                                                                     ss.AFTER: _row(20.0, 4.0)}},
            {"name": "b.n32", "key": "001-b.n32.f16", "contenders": {ss.BEFORE: _row(30.0, 14.0),
                                                                     ss.AFTER: _row(1.0, 0.5, "WRONG")}}]  # fmt: skip
    lines = ss.report_lines(rows, man)
    a = [c.strip() for c in lines[2].split("|")]
    assert a[5:14] == ["250 x 4", "10000000", "14.0", "4.0", "0.71", "2.50", "30.0", "20.0", "1.50"]
    b = [c.strip() for c in lines[3].split("|")]
    assert b[8] == "-" and b[12] == "-"  # the WRONG kernel's times are not shown
    assert "layers timed before and after: 1 of 2; geomean plan before/after: 1.500" in lines
    assert lines[-1].startswith("001-b.n32.f16 convbw[after]: WRONG")


def test_stage_two_without_times_by_name_is_the_call_but_its_longest_kernel():
    row = _row(30.0, 14.0)
    del row["kernel_us_each"]
    assert ss.stage_two_us(row) == pytest.approx(14.0)
