"""bench/wgmma64.py (issue 39 goal 2: the wgmma kernel's 64-row tile on K > 64, timed): the layers (tail7's, then
the held-back losers with a plain wgmma plan), each layer's grid (64-row points beside their 128-row pairs, refused
ones recorded and not built, no plan built twice) and the report on fabricated part rows (no compiler, no GPU)."""

from __future__ import annotations

import pytest
from conftest import bench_script

from convbw_mlir.plan import decide
from convbw_mlir.policies import sm90

w64 = bench_script("wgmma64")


@pytest.fixture(scope="module")
def layers():
    return w64.layers()


def test_layers_are_tail7s_then_the_held_back_losers_in_both_types_each_set_named(layers):
    sets = [where for _, _, where in layers]
    assert sets == sorted(sets, key=w64.SETS.index) and sets.count("heldback") == 2 * len(w64.HELDBACK)
    assert len(layers) == len(w64.tail7.LAYERS) + 2 * len(w64.HELDBACK)
    back = [p for _, p, where in layers if where == "heldback"]
    assert all(sm90.is_sm90(decide(p, "sm_90a")) and p.layout == "NHWGC/GKYXC/NHWGK" for p in back)
    assert {p.dtype for p in back} == {"bf16", "f16"}


def _by_name(layers, name, dtype):
    return next((p, where) for n, p, where in layers if n == name and p.dtype == dtype)


def test_a_wgmma_layers_grid_is_the_plan_then_64_row_points_beside_their_128_row_pairs_none_built_twice(layers):
    p, _ = _by_name(layers, "resnet50.layer4.0.conv3.n32", "bf16")
    vs, acc = w64.variants(p)
    assert vs[0].name == "convbw[heuristic]" and all(a.plan != b.plan for i, a in enumerate(vs) for b in vs[:i])
    rows = {v.label: (v.plan.tile.m, v.plan.tile.n, v.plan.k_batch) for v in vs[1:]}
    assert rows["w64_bn64_k1"] == (64, 64, 1) and rows["w64_bn128_k4"] == (64, 128, 4)
    assert all(m == int(label[1:].split("_")[0]) for label, (m, _, _) in rows.items())
    c = acc["counts"]
    assert c["grid"] == 12 and c["grid"] + 1 == c["refused"] + c["same_plan"] + c["built"]
    assert set(acc["same_plan"].values()) <= {"heuristic"}  # the plan's own point: timed once, as the plan


def test_a_layer_the_wgmma_kernel_does_not_take_builds_the_plan_alone_every_point_refused_by_name(layers):
    p, _ = _by_name(layers, "densenet121.features.denseblock4.denselayer16.conv1.n32", "bf16")  # C = 992
    vs, acc = w64.variants(p)
    assert len(vs) == 1 and len(acc["refused"]) == 12
    assert all(why.startswith("wgmma-rows: ") and "in_channels: 992" in why for why in acc["refused"].values())


def test_a_held_back_row_times_the_products_choice_where_it_differs_from_the_plan(layers):
    p, where = _by_name(layers, "alexnet.features.8.n128", "f16")
    vs, _ = w64.variants(p, where == "heldback")
    assert [v.name for v in vs[:2]] == ["convbw[heuristic]", "convbw[product]"] and vs[0].plan != vs[1].plan


def manifest_entry(i: int, name: str, where: str, fams: dict[str, str], same: dict[str, str]) -> dict:
    """A fabricated manifest entry of a 1x1 2048x512 f16 layer: its grid's families and same-plan points."""
    problem = {"dtype": "f16", "filter_size": [1, 1], "in_channels": 512, "out_channels": 2048}
    contenders = {n: {"ok": True} for n in fams} | {"reference": {"ok": False}}
    return {"name": name, "key": f"{i:03d}-{name}.f16", "set": where, "grid": {"families": fams, "same_plan": same},
            "problem": problem, "contenders": contenders}  # fmt: skip


def part_row(e: dict, us: dict[str, float], wrong: str | None = None) -> dict:
    """A fabricated runner row of entry ``e``: each contender's kernel time (us), ``wrong`` failing its check."""
    cont = {n: {"status": "ok", "kernel_s": t * 1e-6} for n, t in us.items()}
    if wrong:
        cont[wrong] = {"status": "WRONG", "error": "max rel. error 0.5"}
    return {"name": e["name"], "key": e["key"], "contenders": cont}


def _manifest_and_results():
    fams = {"convbw[heuristic]": "w128", "convbw[w64_bn64_k1]": "w64", "convbw[w128_bn64_k1]": "w128",
            "convbw[w64_bn128_k1]": "w64"}  # fmt: skip
    same = {"w128_bn128_k1": "heuristic"}
    man = {"problems": [manifest_entry(0, "a.tuned", "tune", fams, same),
                        manifest_entry(1, "b.back", "heldback", fams, same)]}  # fmt: skip
    rows = [part_row(man["problems"][0], {"convbw[heuristic]": 20.0, "convbw[w64_bn64_k1]": 8.0,
                                          "convbw[w128_bn64_k1]": 16.0, "convbw[w64_bn128_k1]": 10.0, "cudnn": 12.0}),
            part_row(man["problems"][1], {"convbw[heuristic]": 10.0, "convbw[w128_bn64_k1]": 9.0,
                                          "convbw[w64_bn128_k1]": 12.5, "cudnn": 11.0},
                     wrong="convbw[w64_bn64_k1]")]  # fmt: skip
    return man, rows


def test_report_pairs_each_64_row_point_with_its_128_row_twin_and_gives_the_verdict_wrong_ones_untimed():
    man, rows = _manifest_and_results()
    s = w64.summarize(rows, man)
    a, b = s["rows"]
    assert a["best_name"] == "convbw[w64_bn64_k1]" and a["families"]["w64"] == (pytest.approx(8e-6), a["best_name"])
    assert sorted(w64._pairs(a)) == pytest.approx([2.0, 2.0])  # 16/8, and the plan (w128 bn128 k1's twin) 20/10
    assert b["families"]["w64"][1] == "convbw[w64_bn128_k1]" and any("WRONG" in line for line in s["not_ok"])
    text = "\n".join(w64.report_lines(s))
    assert "| tune | 1 | 1 | 2.50 | 2.00 | 1.50 | 1 | 1 |" in text  # plan/w64 20/8; cuDNN/w64 12/8
    assert "| heldback | 1 | 0 | 0.80 | 0.80 | 0.88 | 0 | 0 |" in text  # the wrong bn64 point never counts
    assert "| tune | 1 | 0.60 | 0.60 | 1.50 | 1.50 | 1 | met |" in text
    assert "| heldback | 1 | 1.10 | 1.10 | 1.22 | 1.22 | 1 | met |" in text  # the best: the 128-row bn64 (9 us)
