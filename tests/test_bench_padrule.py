"""bench/padrule.py (issue 39 goal 2): the padded wgmma kernel's split rules judged by pack wgmmapad's FIT rule from
the committed results (bench/results/h100_2026-12-06_wgmmapad; no compiler, no GPU)."""

from __future__ import annotations

import pytest
from conftest import bench_script

rule = bench_script("padrule")


@pytest.fixture(scope="module")
def rows():
    return rule.load(rule.RESULTS)


def test_the_model_as_it_is_reproduces_the_packs_own_split_on_every_layer(rows):
    assert len(rows) == 12 and all(rule.pick(r["problem"], 8) == r["p_auto"] for r in rows)


def test_the_model_as_it_is_fails_fit_on_regnet_y_400mf_alone(rows):
    ok, why = rule.verdict(rule.evaluate(rows, 8))
    assert not ok and len(why) == 1 and why[0].startswith("regnet_y_400mf") and "loses 9%" in why[0]


def test_slices_of_6_k_tiles_split_the_25_k_tile_rows_4_ways_and_pass_fit(rows):
    ev = rule.evaluate(rows, 6)
    assert rule.verdict(ev) == (True, [])
    four = {e["name"] for e in ev if e["point"][2] == 4}
    assert any(n.startswith("regnet_y_400mf") for n in four) and any(n.startswith("densenet121") for n in four)
    assert all(e["us"] is not None for e in ev)  # every point it picks was timed


def test_a_point_outside_the_grid_is_not_evaluable_and_fails_fit(rows):
    ev = [{**e, "us": None, "plan_over_rule": None} if e["set"] == "held" else e for e in rule.evaluate(rows, 6)]
    ok, why = rule.verdict(ev)
    assert not ok and sum("not in the grid" in w for w in why) == 3
