"""bench/wgmmapad.py (issue 39 goal 2: the wgmma kernel on C % 64 != 0 with padded channels, timed): the layers
(tail7's the kernel takes only padded, then the held-back rows with C % 64 != 0), each layer's grid (the padded
plan's own split, 128-row points beside their 64-row pairs, no plan built twice) and the report on fabricated part
rows (no compiler, no GPU)."""

from __future__ import annotations

import pytest
from conftest import bench_script

from convbw_mlir.plan import decide
from convbw_mlir.policies import sm90

pad = bench_script("wgmmapad")


@pytest.fixture(autouse=True)
def _plan_before_the_rule(monkeypatch):
    from convbw_mlir.policies import switches

    # the pack timed the plan before the padded rule (policies/sm90.py PADDED_CHANNELS), which it led to
    monkeypatch.setattr(switches, "WGMMA_PAD_BY_DEFAULT", False)


@pytest.fixture(scope="module")
def layers():
    return pad.layers()


def test_layers_are_tail7s_padded_ones_then_the_held_back_rows_in_both_types_all_sm80_plans_now(layers):
    sets = [where for _, _, where in layers]
    assert sets == sorted(sets, key=pad.SETS.index) and sets.count("heldback") == 2 * len(pad.HELDBACK)
    assert len(layers) == 8 + 2 * len(pad.HELDBACK)  # tail7's 10 refused less the two with 921 channels
    assert all(p.in_channels % 64 and p.in_channels % 8 == 0 for _, p, _ in layers)
    assert not any(sm90.is_sm90(decide(p, "sm_90a")) for _, p, _ in layers)  # the default plan: the sm_80 kernel
    assert {p.dtype for _, p, where in layers if where == "heldback"} == {"bf16", "f16"}


def test_a_layers_grid_is_the_plan_then_padded_points_at_both_tile_rows_none_built_twice(layers):
    name, p, _ = next(x for x in layers if x[0].startswith("xception.block5"))
    vs, acc = pad.variants(p)
    assert vs[0].name == "convbw[heuristic]" and all(a.plan != b.plan for i, a in enumerate(vs) for b in vs[:i])
    points = {v.label: (v.plan.tile.m, v.plan.tile.n, v.plan.k_batch) for v in vs[1:]}
    assert points["p64_bn64_k1"] == (64, 64, 1) and points["p128_bn128_k4"] == (128, 128, 4)
    assert all(sm90.is_sm90(v.plan) for v in vs[1:]) and not sm90.is_sm90(vs[0].plan)
    c = acc["counts"]
    assert c["grid"] == 13 and c["refused"] == 0 and c["grid"] + 1 == c["same_plan"] + c["built"]
    assert {pad.family(v.plan) for v in vs[1:]} == {"p128", "p64"}


def test_report_gives_the_padded_kernel_against_the_plan_and_cudnn_wrong_ones_untimed():
    fams = {"convbw[heuristic]": "sm80", "convbw[p128_bn64_k1]": "p128", "convbw[p64_bn64_k1]": "p64"}

    def entry(i, name, where):
        problem = {"dtype": "f16", "filter_size": [1, 1], "in_channels": 728, "out_channels": 728}
        return {"name": name, "key": f"{i:03d}-{name}.f16", "set": where, "grid": {"families": fams, "same_plan": {}},
                "problem": problem, "contenders": {n: {"ok": True} for n in fams}}  # fmt: skip

    man = {"problems": [entry(0, "a.tuned", "tune"), entry(1, "b.back", "heldback")]}

    def row(e, us, wrong=None):
        cont = {n: {"status": "ok", "kernel_s": t * 1e-6} for n, t in us.items()}
        if wrong:
            cont[wrong] = {"status": "WRONG", "error": "max rel. error 0.5"}
        return {"name": e["name"], "key": e["key"], "contenders": cont}

    rows = [row(man["problems"][0], {"convbw[heuristic]": 20.0, "convbw[p128_bn64_k1]": 8.0,
                                     "convbw[p64_bn64_k1]": 10.0, "cudnn": 12.0}),
            row(man["problems"][1], {"convbw[heuristic]": 10.0, "convbw[p128_bn64_k1]": 12.5, "cudnn": 11.0},
                wrong="convbw[p64_bn64_k1]")]  # fmt: skip
    s = pad.summarize(rows, man)
    assert any("WRONG" in line for line in s["not_ok"])
    text = "\n".join(pad.report_lines(s))
    assert "| tune | 1 | 1 | 2.50 | 0.80 | 1.50 | 1 | 1 |" in text  # plan/padded 20/8, p128/p64 8/10, cuDNN 12/8
    assert "| heldback | 1 | 0 | 0.80 | - | 0.88 | 0 | 0 |" in text  # the wrong p64 point never counts
    assert "| heldback | 1 | 1.10 | 1.10 | 1.10 | 1.10 | 1 |" in text  # the best: the plan (10 us)
