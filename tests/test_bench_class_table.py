"""bench/class_table.py (issue 40): the classes by shape, the deterministic selection (held-back models first,
spread over models), the round-robin order that keeps every class in a cut run, and the report against the goals."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

from convbw_mlir.problem import ConvBwdWeightProblem as P

ct = bench_script("class_table")


def _p(ck: str) -> P:
    return P.from_ck(ck)


@pytest.mark.parametrize(
    ("ck", "cls"),
    [
        ("2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3", "dw"),  # ConvNeXt-T 7x7 depthwise
        ("1 1536 8 1 1 4 2048 1 1 3 0", "dw"),  # Mamba's causal 1-D depthwise
        ("3 192 8 1 1 3 3 3 16 14 14 1 1 1 1 1 1 1 1 1 1 1 1", "dw"),  # X3D's 3-D depthwise
        ("2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1", "thin"),  # ResNeXt-50 32x4d
        ("2 4 32 16 16 3 3 28 28 1 1 1 1 1 1 1 1", "thin"),  # RegNetX-400MF: 16 a group, the bound
        ("2 8 32 56 56 3 3 28 28 1 1 1 1 1 1 1 1", "medium"),  # RegNetY-8GF's 56-channel groups
        ("1 1 8 512 1 10 16000 5 1 0 0", "conv1d"),  # wav2vec 2.0 conv0: C = 1 but 1-D, long
        ("3 1 8 64 3 3 7 7 16 112 112 1 2 2 1 1 1 1 3 3 1 3 3", "conv3d"),  # R3D-18's stem
        ("3 1 1 1 32 3 3 3 32 32 32 1 1 1 1 1 1 1 1 1 1 1 1", "gemv"),  # CK's 3-D K = 1 case
        ("2 1 32 64 16 1 1 1 1 1 1 1 1 0 0 0 0", "gemv"),  # squeeze-excitation: 32 rows
        ("2 1 256 64 3 7 7 224 224 2 2 1 1 3 3 3 3", "first"),  # ResNet-50 conv1
        ("2 1 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1", "dense"),
    ],
)
def test_problem_class_by_shape(ck, cls):
    assert ct.problem_class(_p(ck)) == cls


def test_the_suites_classes_agree_with_the_shape_rule_but_for_the_depthwise_ones():
    """The classes suite's own class (its names' first word) is the shape's, except its 1-D and 3-D depthwise
    layers, which the issue counts as depthwise."""
    from convbw_mlir.suites import load_suite

    differ = {n: ct.problem_class(p) for n, p in load_suite("classes") if ct.problem_class(p) != n.split("_")[0]}
    assert differ == {"conv1d_conformer_m_dw31": "dw", "conv1d_quartznet_dw33": "dw", "conv3d_x3d_depthwise_g192": "dw"}


def _zoo() -> tuple[list, dict[str, list[str]], list[str]]:
    dense = "2 1 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1"
    zoo = [(f"m{m}.l{i}", _p(dense)) for m in range(3) for i in range(4)]
    models = {n: [n.split(".")[0]] for n, _ in zoo}
    models["m0.l3"] = ["m0", "m1"]  # shared with a tuned model: not held out
    return zoo, models, ["m0"]


def test_select_prefers_held_out_layers_then_spreads_over_models_and_caps_each_class():
    zoo, models, held = _zoo()
    picks = ct.select(5, suite=[], zoo=zoo, models=models, held=held, extra=False)["dense"]
    assert [k.held_out for k in picks] == [True, True, True, False, False]
    assert {k.name.split(".")[0] for k in picks[:3]} == {"m0"}  # every held-out layer first
    assert "m0.l3" not in [k.name for k in picks[:3]]
    assert {k.name.split(".")[0] for k in picks[3:]} == {"m1", "m2"}  # then one a model in turn
    again = ct.select(5, suite=[], zoo=list(reversed(zoo)), models=models, held=held, extra=False)["dense"]
    assert [k.name for k in again] == [k.name for k in picks]  # the order is the seed's, not the suite's


def test_select_refuses_a_negative_count():
    with pytest.raises(ValueError, match="per_class: expected a count >= 0, got -1"):
        ct.select(-1, suite=[], zoo=[], models={}, held=[])


def test_round_robin_a_prefix_holds_every_class_and_alternates_suite_and_zoo():
    order = ct.round_robin(ct.select(3))
    classes = [k.cls for k in order]
    assert set(classes[: len(ct.CLASSES)]) == set(ct.CLASSES)  # one round: every class once
    dw = [k.source for k in order if k.cls == "dw"]
    assert dw[:4] == ["classes", "zoo", "classes", "zoo"]
    assert len(order) == len({(k.name, k.source) for k in order})


def test_entries_put_each_layers_types_together_channels_last():
    es = ct.entries(1)
    assert [e[2].dtype for e in es[:4]] == ["f16", "bf16", "f16", "bf16"]
    assert es[0][0].endswith(".f16") and es[1][0] == es[0][0][:-4] + ".bf16"
    assert all(e[2].layout_family.ck_code == 2 and e[2].dw_dtype == e[2].dtype for e in es)
    assert len({e[0] for e in es}) == len(es)


def test_classes_keep_only_those_classes_rows_with_the_whole_tables_keys_and_order():
    """A class re-run (``--classes``) is the whole table's rows of those classes: same keys, same order, both types."""
    whole = ct.entries(1)
    for names in (["thin"], ["thin", "gemv"], ["gemv", "thin"]):
        got = [key for key, _, _ in ct.entries(1, classes=names)]
        assert got == [key for key, k, _ in whole if k.cls in names]
    thin = ct.entries(1, classes=["thin"])
    assert thin and {k.cls for _, k, _ in thin} == {"thin"} and [p.dtype for _, _, p in thin[:2]] == ["f16", "bf16"]


def test_an_unknown_class_is_one_error_listing_the_known_ones(tmp_path, capsys):
    known = "known: first, conv1d, conv3d, dw, thin, medium, gemv, dense"
    with pytest.raises(ValueError, match=f"classes: unknown class 'thn'; {known}"):
        ct.entries(1, classes=["thin", "thn"])
    with pytest.raises(ValueError, match="unknown class '\\(none\\)'"):
        ct.known_classes([])
    with pytest.raises(ValueError, match="unknown class 'thn'"):  # before any compile or folder
        ct.compile_all(tmp_path / "art", 1, 1, 1.0, None, classes=["thn"])
    assert not (tmp_path / "art").exists()
    for cmd in (["select"], ["compile", str(tmp_path / "art")]):
        with pytest.raises(SystemExit) as e:
            ct.main([*cmd, "--classes", "thin,thn"])
        assert e.value.code == 1
        assert capsys.readouterr().err == f"class_table.py: error: --classes: unknown class 'thn'; {known}\n"
    assert not (tmp_path / "art").exists()


def test_select_with_classes_prints_only_those_classes_and_their_keys(capsys):
    assert ct.main(["select", "--per-class", "1", "--classes", "dw,thin"]) == 0
    out = capsys.readouterr().out
    rows = [r.split(" | ")[0] for r in out.splitlines() if r.startswith("| ") and "class" not in r]
    assert rows == ["| dw", "| thin"]
    keys = [key for key, _, _ in ct.entries(1, types=("f16",), classes=["dw", "thin"])]
    assert out.rstrip().endswith(", ".join(keys))


def test_kernel_of_names_the_plans_kernel():
    assert ct.kernel_of({"gemv": {"k_block": 8}}) == "gemv"
    assert ct.kernel_of({"depthwise": {"vector": 4}}) == "depthwise"
    wg = {"strategy": "explicit", "tile": {"intrinsic": "NV_WGMMA_F32_64x128x16_F16"}, "split": {"k_batch": 66}}
    assert ct.kernel_of(wg) == "wgmma split 66"
    mma = {"tile": {"intrinsic": "NV_MMA_SYNC_F32_16x8x16_F16"}, "merge": {"groups": 8}, "split": {"k_batch": 1}}
    assert ct.kernel_of(mma) == "mma.sync merge 8"
    assert ct.kernel_of({"strategy": "simt"}) == "simt"


def _row(name: str, cls: str, dtype: str, ours: float | None, cudnn: float | None, status: str = "ok") -> dict:
    cont = {"convbw": {"status": status, "kernel_s": ours, "config": {"kernel": "wgmma"}} if ours
            else {"status": status}}  # fmt: skip
    cont["cudnn"] = {"status": "ok", "kernel_s": cudnn} if cudnn else {"status": "crashed"}
    return {"name": name, "key": f"000-{name}.{dtype}", "class": cls, "source": "zoo", "held_out": True,
            "contenders": cont}  # fmt: skip


def test_class_summary_judges_each_goal_and_names_the_layers_below_the_floor():
    rows = [_row("a", "dw", "f16", 120e-6, 100e-6), _row("a", "dw", "bf16", 100e-6, 100e-6),
            _row("b", "dw", "f16", 100e-6, 40e-6), _row("b", "dw", "bf16", 100e-6, 200e-6)]  # fmt: skip
    s = ct.class_summary(rows)
    assert s["types"]["f16"]["below_floor"] == ["b"] and s["types"]["bf16"]["below_floor"] == []
    assert s["min"] == pytest.approx(0.4)
    assert s["f16_over_bf16"] == pytest.approx(1.2) and s["pairs"] == 2
    g = (100 / 120 * 0.4 * 1.0 * 2.0) ** 0.25
    assert s["geomean"] == pytest.approx(g)
    assert s["goals"] == {"geomean >= 1.0": False, "none < 0.5": False, "f16 within 10% of bf16": False}


def test_class_summary_leaves_a_goal_unmeasured_without_figures_and_lists_wrong_kernels():
    rows = [_row("a", "thin", "f16", None, 100e-6, status="WRONG"), _row("b", "thin", "bf16", 50e-6, None)]
    rows[1]["contenders"]["cudnn"]["status"] = "WRONG"
    s = ct.class_summary(rows)
    assert s["goals"] == {"geomean >= 0.9": None, "none < 0.5": None, "f16 within 10% of bf16": None}
    assert s["wrong"] == ["000-a.f16"] and s["cudnn_wrong"] == ["000-b.bf16"] and len(s["unmeasured"]) == 2
    text = ct.report(rows)
    assert "- WRONG (ours): 000-a.f16" in text and "| a | zoo (held out) | f16 | WRONG | - |" in text
    assert "- cuDNN's own result WRONG (no ratio): 000-b.bf16" in text


def test_report_reads_a_cut_run_and_writes_a_line_a_class_in_the_classes_order(tmp_path):
    rows = [_row("g", "gemv", "f16", 50e-6, 25e-6), _row("f", "first", "f16", 100e-6, 110e-6),
            _row("f", "first", "bf16", 100e-6, 110e-6)]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got, device = ct.read_rows([path])
    text = ct.report(got, device, card="NVIDIA H100 80GB HBM3", command="bash run.sh")
    head = text.split("## ")[0]
    assert "NVIDIA H100 80GB HBM3" in head and "`bash run.sh`" in head
    first, gemv = head.index("| first |"), head.index("| gemv |")
    assert first < gemv
    assert "| first | 1 (2) | 1.10 | 1.10 | 1.10 | 1.10 | 0 | 1.000 | met | met | met |" in head
    assert "| gemv | 1 (1) | 0.50 | 0.50 | 0.50 | - | 0 | - | MISSED | met | unmeasured |" in head
    assert "| g | zoo (held out) | f16 | 50.0 | wgmma | 25.0 | 0.50 |" in text


def test_run_writes_each_row_as_it_comes_with_the_manifests_class(tmp_path, monkeypatch):
    """A run cut short keeps the rows it finished, each with its class (the runner's rows carry none)."""
    from convbw_mlir.measure import run as runner
    from convbw_mlir.measure.records import ManifestEntry, ResultRow

    p = _p("2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3")
    entry = ManifestEntry("dw_a", "000-dw_a.f16", p.to_dict(), {"convbw": {"ok": False, "error": "x"}},
                          {"class": "dw", "source": "classes", "held_out": False})  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps({"target": "sm_90a", "iree_version": "3.13",
                                                        "problems": [entry.to_dict()]}))  # fmt: skip
    seen = []

    def fake(folder, **kw):
        assert kw["server"] and kw["numpy_max_flops"] == 0.0
        row = ResultRow.head(entry, {"convbw": {"status": "no kernel"}})
        kw["log"](runner._line(row))
        seen.append(json.loads((tmp_path / "out" / "rows.jsonl").read_text()))  # written before the run ends
        return {"device": "H100", "problems": [row.to_dict()]}

    line = runner._line
    monkeypatch.setattr(runner, "run_manifest", fake)
    assert ct.run(tmp_path, tmp_path / "out") == 0
    assert seen[0]["class"] == "dw" and seen[0]["key"] == "000-dw_a.f16"
    assert json.loads((tmp_path / "out" / "results.json").read_text())["problems"][0]["source"] == "classes"
    assert runner._line is line  # the runner's own logging is back


def test_the_gemv_kernels_rows_carry_the_plan_it_replaced_and_the_report_compares_them():
    p = _p("1 1 8 512 1 10 16000 5 1 0 0")  # wav2vec 2.0 conv0: the GEMV kernel's by rule
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import switches

    assert decide(p, "sm_90a").gemv is not None
    before = ct.plan_without_gemv(p)
    assert before.gemv is None and switches.GEMV_BY_DEFAULT  # the switch is back
    rows = [_row("w", "conv1d", "f16", 20e-6, 30e-6), _row("w", "conv1d", "bf16", 20e-6, 30e-6)]
    rows[0]["contenders"][ct.BEFORE] = {"status": "ok", "kernel_s": 50e-6}
    rows[1]["contenders"][ct.BEFORE] = {"status": "ok", "kernel_s": 10e-6}
    text = ct.report(rows)
    assert "| w | zoo (held out) | f16 | 20.0 | wgmma | 30.0 | 1.50 | 50.0 | 2.50 |" in text
    assert "before/ours): geomean 1.12, faster on 1 of 2 rows" in text


def test_collect_calls_a_row_current_only_where_todays_plan_and_kernel_code_are_what_was_timed():
    from dataclasses import replace

    from convbw_mlir.plan import decide

    cc = bench_script("class_collect")
    dense = _p("2 1 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1").with_(layout=2)
    plan = decide(dense, "sm_90a")
    assert cc._form(dense, plan.to_dict()) == "current"
    other = replace(plan, tile=replace(plan.tile, n=plan.tile.n // 2)).to_dict()
    assert cc._form(dense, other) == "earlier (another plan)"
    dw = _p("2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3").with_(layout=2)
    assert cc._form(dw, decide(dw, "sm_90a").to_dict()) == "earlier (the kernel's code then)"
    assert cc._form(dw, None).startswith("unchecked")
