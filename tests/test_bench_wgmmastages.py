"""bench/wgmmastages.py (issue 39 goal 2: the wgmma kernel's ring depth, timed): the layers (wgmma64's the plain wgmma
kernel takes, cut to the pack's kernel limit), each layer's grid (every depth beside its 4-stage pair, each tile's
most, no plan built twice) and the report on fabricated part rows (no compiler, no GPU)."""

from __future__ import annotations

import pytest
from conftest import bench_script

from convbw_mlir.dispatch.variants import SHORT_DENSE_REDUCTION
from convbw_mlir.plan import decide
from convbw_mlir.policies import sm90

ws = bench_script("wgmmastages")


@pytest.fixture(scope="module")
def layers():
    return ws.layers()


def test_layers_are_wgmma64s_that_the_wgmma_kernel_takes_within_the_kernel_limit_the_longest_cut_first(layers):
    assert all(sm90.takes(p) for _, p, _ in layers)
    sets = [where for _, _, where in layers]
    assert sets == sorted(sets, key=ws.SETS.index) and set(sets) == set(ws.SETS)
    built = sum(ws._built(n, p.dtype, w == "heldback") for n, p, w in layers)
    assert built <= ws.LIMIT_KERNELS
    taken = [(n, p.dtype) for n, p, _ in ws.wgmma64.layers() if sm90.takes(p)]
    cut = set(taken) - {(n, p.dtype) for n, p, _ in layers}
    assert cut == {("alexnet.features.8.n128", "bf16"), ("alexnet.features.8.n128", "f16")}  # 21,632 rows
    assert all(ws.tail7.reduction(p) > SHORT_DENSE_REDUCTION for n, p, _ in ws.wgmma64.layers() if (n, p.dtype) in cut)


def _by_name(layers, name, dtype):
    return next((p, where) for n, p, where in layers if n == name and p.dtype == dtype)


def test_a_layers_grid_is_each_depth_beside_its_4_stage_pair_up_to_the_tiles_most_none_built_twice(layers):
    p, _ = _by_name(layers, "mobilenet_v2.features.18.0.n32", "f16")
    kb = decide(p, "sm_90a").k_batch
    vs, acc = ws.variants(p)
    assert vs[0].name == "convbw[heuristic]" and all(a.plan != b.plan for i, a in enumerate(vs) for b in vs[:i])
    got = {v.label: (v.plan.tile.stages, v.plan.tile.n, v.plan.k_batch, v.plan.tile.m) for v in vs[1:]}
    labels = set(got) | set(acc["same_plan"])
    assert kb > 1 and {f"s{n}_bn64_k{k}" for n in (4, 6, 8) for k in (1, kb)} <= labels
    assert {f"s9max_bn64_k{k}" for k in (1, kb)} | {f"s7max_bn128_k{k}" for k in (1, kb)} <= labels  # each tile's most
    assert not any(label.startswith("s8_bn128") for label in labels)  # past the 128x128 tile's 7
    depth = {label: int(label[1:].split("_")[0].removesuffix("max")) for label in got}
    assert all(m == 128 and depth[label] == n for label, (n, _, _, m) in got.items())
    c = acc["counts"]
    assert c["grid"] == 14 and not acc["refused"] and c["grid"] + 1 == c["same_plan"] + c["built"]
    assert set(acc["same_plan"]) <= {f"s4_bn{n}_k{kb}" for n in (64, 128)}  # the plan's own point: timed as the plan
    assert {acc["families"][v.name] for v in vs} == {"s4", "deep"}


def _manifest_and_results():
    from test_bench_wgmma64 import manifest_entry, part_row

    fams = {"convbw[heuristic]": "s4", "convbw[s6_bn64_k1]": "deep", "convbw[s9max_bn64_k1]": "deep",
            "convbw[s4_bn64_k1]": "s4", "convbw[s7max_bn128_k1]": "deep"}  # fmt: skip
    same = {"s4_bn128_k1": "heuristic"}
    man = {"problems": [manifest_entry(0, "a.tuned", "tune", fams, same),
                        manifest_entry(1, "b.back", "heldback", fams, same)]}  # fmt: skip
    rows = [part_row(man["problems"][0], {"convbw[heuristic]": 20.0, "convbw[s4_bn64_k1]": 16.0,
                                          "convbw[s6_bn64_k1]": 10.0, "convbw[s9max_bn64_k1]": 8.0,
                                          "convbw[s7max_bn128_k1]": 25.0, "cudnn": 12.0}),
            part_row(man["problems"][1], {"convbw[heuristic]": 10.0, "convbw[s4_bn64_k1]": 9.0,
                                          "convbw[s6_bn64_k1]": 12.0, "cudnn": 11.0},
                     wrong="convbw[s9max_bn64_k1]")]  # fmt: skip
    return man, rows


def test_report_pairs_each_deeper_point_with_its_4_stage_twin_by_depth_and_gives_the_verdict_wrong_ones_untimed():
    man, rows = _manifest_and_results()
    s = ws.wgmma64.summarize(rows, man)
    a, b = s["rows"]
    assert a["best_name"] == "convbw[s9max_bn64_k1]" and a["families"]["deep"] == (pytest.approx(8e-6), a["best_name"])
    pairs = ws._pairs(a)  # 16/10, 16/8, and the 128-wide max against the plan (s4 bn128 k1's twin): 20/25
    assert pairs == {"6": [pytest.approx(1.6)], "max": [pytest.approx(2.0), pytest.approx(0.8)]}
    assert ws._pairs(b) == {"6": [pytest.approx(0.75)]} and any("WRONG" in line for line in s["not_ok"])
    text = "\n".join(ws.report_lines(s))
    assert "| tune | max | 2 | 1.26 | 1 | 1 |" in text and "| tune | 6 | 1 | 1.60 | 1 | 0 |" in text
    assert "| heldback | 6 | 1 | 0.75 | 0 | 0 |" in text  # the wrong max point never counts
    assert "| tune | 1 | 2.50 | 1.50 | 1 | 1 |" in text  # plan/deeper 20/8, cuDNN/deeper 12/8
    assert "| tune | 1 | 0.60 | 0.60 | 1.50 | 1.50 | 1 | met |" in text
    assert "| heldback | 1 | 1.10 | 1.10 | 1.22 | 1.22 | 1 | met |" in text  # the best: the 4-stage bn64 (9 us)
