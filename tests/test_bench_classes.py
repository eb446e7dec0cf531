"""bench/classes.py: issue 23's per-class table groups the runner's rows by class and judges ours against
cuDNN and IREE's best form per class; every class of the suite has real layers of at least three models."""

from __future__ import annotations

import json

from conftest import bench_script

classes = bench_script("classes")


def _row(key: str, ours: float | None, cudnn: float, iree: dict[str, float]) -> dict:
    cont = {"cudnn": {"status": "ok", "median_s": cudnn}}
    cont |= {f: {"status": "ok", "median_s": t} for f, t in iree.items()}
    cont["convbw"] = {"status": "ok", "median_s": ours, "config": {"strategy": "explicit", "k_batch": 1}} if ours \
        else {"status": "WRONG"}  # fmt: skip
    return {"name": key.split(".")[0], "key": key, "contenders": cont}


def test_every_class_has_layers_of_three_models_and_the_layout4_names_exist():
    from convbw_mlir.suites import load_suite

    names = [n for n, _ in load_suite(classes.SUITE)]
    models: dict[str, set[str]] = {}
    for n in names:
        cls, model = n.split("_")[:2]
        models.setdefault(cls, set()).add(model)
    assert set(models) == {"first", "conv1d", "conv3d", "dw", "thin"}
    assert all(len(m) >= 3 for m in models.values()), models
    assert set(classes.LAYOUT4) <= set(names)


def test_entries_get_iree_forms_in_f16_only_and_layout4_twins():
    entries = classes.problems(["f16", "bf16"], only=["thin_resnext50_g32_c4_56"])
    assert [(n, p.dtype, p.layout_family.ck_code, "iree_fusilli" in f) for n, p, f in entries] == [
        ("thin_resnext50_g32_c4_56", "f16", 2, True),
        ("thin_resnext50_g32_c4_56.layout4", "f16", 4, True),
        ("thin_resnext50_g32_c4_56", "bf16", 2, False),
    ]


def test_report_groups_by_class_with_ratios_and_bf16_against_f16(tmp_path):
    rows = [
        _row("dw_a.f16", 100e-6, 200e-6, {"iree_direct": 300e-6, "iree_fusilli": 150e-6}),
        _row("dw_a.bf16", 110e-6, 220e-6, {}),
        _row("first_b.f16", 400e-6, 100e-6, {"iree_torch": 800e-6}),
        _row("first_c.f16", None, 100e-6, {"iree_torch": 800e-6}),
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"device": "H100", "problems": rows}))
    text = classes.report([path], [])
    dw, first = text.split("## dw")[1].split("## first")
    assert "| dw_a.f16 | 100.0 | explicit | 150.0 | 200.0 | 2.00 | 1.50 |" in dw
    assert "f16: cuDNN/ours geomean 2.00" in dw and "bf16/f16 (ours): geomean 1.100" in dw
    assert "| first_c.f16 | WRONG |" in first  # a wrong kernel is shown, never timed
    assert "f16: cuDNN/ours geomean 0.25, worst 0.25 (1 problems)" in first


def test_report_times_by_kernel_time_where_cupti_gave_one(tmp_path):
    row = _row("dw_a.f16", 900e-6, 300e-6, {})  # call times: the runner's host round trip included
    row["contenders"]["convbw"]["kernel_s"] = 100e-6
    row["contenders"]["cudnn"]["kernel_s"] = 200e-6
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"device": "H200", "problems": [row]}))
    assert "| dw_a.f16 | 100.0 | explicit | - | 200.0 | 2.00 | - |" in classes.report([path], [])
