"""bench/tail7.py (issue 39: the dense short-reduction class searched on Hopper): the layers are of the class, the
tuned models' first and the held-out ones marked by the zoo's split; each problem's grid is pruned to legal, distinct
plans (the plan's first, every family the problem takes, the refused recorded and not built, every grid point
accounted for); the report's per-family best and verdict (no compiler, no GPU: fabricated rows)."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

from convbw_mlir.policies import sm90, switches

t7 = bench_script("tail7")


@pytest.fixture(scope="module")
def layers():
    return t7.layers()


def test_layers_are_dense_short_reductions_tuned_first_held_out_by_the_zoo_split(layers):
    held = json.loads(t7.SPLIT.read_text())["held_out"]
    assert 20 <= len(layers) <= 28
    assert all(t7.class_refusal(p) == "" and p.groups == 1 and t7.reduction(p) <= 3136 for _, p, _ in layers)
    assert [h for _, _, h in layers] == sorted(h for _, _, h in layers)  # every tuned layer before any held-out
    assert all(h == (name.split(".")[0] in held) for name, _, h in layers)
    assert sum(h for _, _, h in layers) >= 4 and {p.dtype for _, p, _ in layers} == {"f16", "bf16"}
    assert {p.rank for _, p, _ in layers} == {2, 3} and any(p.filter_size != (1, 1) for _, p, _ in layers)
    assert any(sm90.takes(p) for _, p, _ in layers) and any(not sm90.takes(p) for _, p, _ in layers)


def test_a_layer_outside_the_class_or_the_zoo_is_refused_by_name():
    with pytest.raises(ValueError, match=r"resnet50.layer1.0.conv1.n32.*reduction: 100352"):  # 56x56 at batch 32
        t7.layers([("resnet50.layer1.0.conv1.n32", "f16")], held=set())
    with pytest.raises(ValueError, match="'no.such.layer' .* not a zoo problem"):
        t7.layers([("no.such.layer", "f16")], held=set())


def _by_name(layers, name, dtype):
    return next(p for n, p, _ in layers if n == name and p.dtype == dtype)


def test_a_wgmma_problems_grid_is_the_plan_then_distinct_legal_plans_of_every_family_all_accounted(layers):
    p = _by_name(layers, "resnet50.layer4.0.conv3.n32", "bf16")
    vs, acc = t7.prune(p)
    assert vs[0].name == "convbw[heuristic]" and len(vs) == t7.MAX_VARIANTS
    assert all(a.plan != b.plan for i, a in enumerate(vs) for b in vs[:i])  # no plan built twice
    assert set(acc["families"].values()) == {"wgmma", "wgmma_sk", "sm80", "codegen"}
    assert acc["families"]["convbw[wgmma_bn64_k1]"] == "wgmma"  # the width the tuner never asked for
    # 25 k tiles: a split of 6 or more leaves the last slice empty; refused, never built
    assert "leave the last one empty" in acc["refused"]["wgmma_bn128_k6"]
    assert not set(acc["refused"]) & {v.label for v in vs}
    c = acc["counts"]
    assert c["grid"] == c["refused"] + c["same_plan"] + c["pruned"] + c["built"] - 1  # the plan is not a grid point
    assert c["built"] == len(vs) and c["pruned"] == len(acc["pruned"]) > 0


def test_a_problem_the_wgmma_kernel_did_not_take_gets_the_sm80_kernels_grid_and_codegen(layers, monkeypatch):
    """The grid pack tail7 timed (before the padded-channels rule: C = 992 was the sm_80 kernel's then)."""
    p = _by_name(layers, "densenet121.features.denseblock4.denselayer16.conv1.n32", "bf16")  # C = 992
    assert not sm90.takes(p) and sm90.pads_by_default(p)  # today's plan pads it to 1024 for the wgmma kernel
    monkeypatch.setattr(switches, "WGMMA_PAD_BY_DEFAULT", False)  # the rule off: the plan tail7 measured
    vs, acc = t7.prune(p)
    assert set(acc["families"].values()) <= {"sm80", "sm80_ws", "codegen"} and "codegen" in acc["families"].values()
    wgmma = [label for label in acc["refused"] if label.startswith("wgmma")]
    assert len(wgmma) == len(t7.WGMMA_ORDER) + len(t7.STREAMK_WIDTHS)  # every wgmma ask: another kernel's plan
    assert len(vs) == t7.MAX_VARIANTS


def _manifest_and_results():
    def entry(i, name, held, fams):
        problem = {"dtype": "f16", "filter_size": [1, 1], "in_channels": 512, "out_channels": 2048}
        contenders = {n: {"ok": True} for n in fams} | {"reference": {"ok": False}}
        return {"name": name, "key": f"{i:03d}-{name}.f16", "held_out": held, "grid": {"families": fams},
                "problem": problem, "contenders": contenders}  # fmt: skip

    fams = {"convbw[heuristic]": "wgmma", "convbw[wgmma_bn64_k1]": "wgmma", "convbw[sm80_own]": "sm80",
            "convbw[codegen]": "codegen"}  # fmt: skip
    man = {"problems": [entry(0, "a.tuned", False, fams), entry(1, "b.held", True, fams)]}

    def row(e, us):
        cont = {n: {"status": "ok", "kernel_s": t * 1e-6} for n, t in us.items()}
        cont["convbw[codegen]"] = {"status": "WRONG", "error": "max rel. error 0.5"}
        return {"name": e["name"], "key": e["key"], "contenders": cont}

    rows = [row(man["problems"][0], {"convbw[heuristic]": 20.0, "convbw[wgmma_bn64_k1]": 10.0,
                                     "convbw[sm80_own]": 30.0, "cudnn": 12.0}),
            row(man["problems"][1], {"convbw[heuristic]": 16.0, "convbw[wgmma_bn64_k1]": 24.0,
                                     "convbw[sm80_own]": 8.0, "cudnn": 10.0})]  # fmt: skip
    return man, rows


def test_report_gives_each_familys_best_the_winner_and_the_verdict_against_cudnn_wrong_ones_untimed():
    man, rows = _manifest_and_results()
    s = t7.summarize(rows, man)
    a, b = s["rows"]
    assert a["best_name"] == "convbw[wgmma_bn64_k1]" and a["best"] == pytest.approx(10e-6) and not a["held_out"]
    assert b["best_name"] == "convbw[sm80_own]" and b["held_out"] and b["plan_family"] == "wgmma"
    assert "codegen" not in a["families"] and any("WRONG" in line for line in s["not_ok"])  # a wrong kernel: no time
    text = "\n".join(t7.report_lines(s))
    assert "| tune | wgmma | 1 | 1 | 2.00 | 1.20 | 1 |" in text  # plan/best 20/10; cuDNN/best 12/10; beats cuDNN
    assert "| held | sm80 | 1 | 1 | 2.00 | 1.25 | 1 |" in text
    assert "| tune | 1 | 0.60 | 1.20 | 1.20 | 1 |" in text  # cuDNN/plan 12/20; the grid's best 12/10
    assert "| convbw[wgmma_bn64_k1] | 2 | 1 | 0 | 1.73 |" in text  # 10/10 and 24/8: geomean sqrt(3)


def test_estimate_counts_each_built_kernel_and_cudnn_a_problem_and_the_server_start():
    man, _ = _manifest_and_results()
    man["problems"][1]["contenders"]["convbw[codegen]"] = {"ok": False, "error": "IREE failed"}  # not built: no time
    assert t7.estimate_s(man) == pytest.approx(t7.START_S + t7.CONTENDER_S * ((4 + 1) + (3 + 1)))
