"""bench/zoo_tune.py: the slice order is fixed and spreads over the zoo's models; slices' results merge into one
(the first measurement of a problem kept); the report builds the database with cuDNN's times and the
leave-model-out evaluation on the committed split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import bench_script

zoo_tune = bench_script("zoo_tune")


def test_the_slice_order_is_every_zoo_problem_in_both_types_spread_over_models():
    from convbw_mlir.dispatch.generalize import is_held_out, read_models, read_split

    order = zoo_tune.slice_order()
    assert len(order) == 2 * 890 and len({(n, p.dtype) for n, p in order}) == 1780
    assert order == zoo_tune.slice_order()  # decided by the names alone
    models, split = read_models("zoo"), read_split(zoo_tune.SPLIT)
    first = order[:180]
    assert len({m for n, _ in first for m in models[n]}) >= 40  # of 44
    assert 15 <= sum(is_held_out(models[n], split) for n, _ in first) <= 50  # 160 of 890 held out
    assert 60 <= sum(p.dtype == "f16" for _, p in first) <= 120


def _results(rows: list[dict], target: str = "sm_90a") -> dict:
    return {"target": target, "iree_version": "3.13.0", "date": "2026-12-06", "device": "NVIDIA H100 80GB HBM3",
            "problems": rows, "server": [{"wall_s": 1.0}]}  # fmt: skip


def _row(i: int, name: str, problem, variants: dict, times: dict[str, float], cudnn: float) -> dict:
    contenders = {n: {"status": "ok", "median_s": 80e-6, "kernel_s": t} for n, t in times.items()}
    contenders["cudnn"] = {"status": "ok", "median_s": 80e-6, "kernel_s": cudnn}
    return {"name": name, "key": f"{i:03d}-{name}.{problem.dtype}", "problem": problem.to_dict(),
            "contenders": contenders, "heuristic": "convbw[heuristic]", "held_out": False,
            "variants": {n: v.to_dict() for n, v in variants.items()}}  # fmt: skip


def _slices(tmp_path, count: int = 60):
    """Two results files over the zoo's first problems: the law favours a split twice the rule's."""
    from convbw_mlir.dispatch.variants import candidates

    rows = []
    for i, (name, p) in enumerate(zoo_tune.slice_order()[:count]):
        vs = {v.name: v for v in candidates(p, "sm_90a", max_plans=2, iree=False)}
        t = {n: 10e-6 * (1.5 if n == "convbw[heuristic]" else 1 + j / 10) for j, n in enumerate(vs)}
        rows.append(_row(i, name, p, vs, t, cudnn=12e-6))
    for k, part in enumerate((rows[: count // 2], rows[count // 2 - 5 :])):  # 5 problems measured twice
        (tmp_path / f"s{k}").mkdir()
        (tmp_path / f"s{k}" / "results.json").write_text(json.dumps(_results(part)))
    return rows


def test_slices_merge_into_one_results_keeping_a_problems_first_measurement(tmp_path):
    rows = _slices(tmp_path)
    merged = zoo_tune.merged_results(sorted(tmp_path.rglob("results.json")))
    assert [r["key"] for r in merged["problems"]] == [r["key"] for r in rows]
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "results.json").write_text(json.dumps(_results(rows[:1], target="sm_80")))
    with pytest.raises(ValueError, match=r"s2/results.json: target 'sm_80', the others' 'sm_90a'"):
        zoo_tune.merged_results(sorted(tmp_path.rglob("results.json")))


def test_the_report_ships_a_database_with_cudnn_times_and_evaluates_leave_model_out(tmp_path):
    from convbw_mlir.dispatch.db import TuningDB

    rows = _slices(tmp_path)
    out = tmp_path / "report"
    assert zoo_tune.main(["report", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(out)]) == 0
    db = TuningDB.load(out / "nvidia-h100-80gb-hbm3.sm_90a.json", strict=True)
    assert len(db.entries) == len(rows) and all(e["cudnn_s"] == 12e-6 for e in db.entries.values())
    assert all(e["median_s"] < 15e-6 and "over the heuristic's plan" in e["why"] for e in db.entries.values())
    report = json.loads((out / "generalize.json").read_text())
    assert report["held_out_problems"] > 0 and "heuristic" in report["selectors"]
    text = (out / "report.md").read_text()
    assert "| all | 60 |" in text and "Leave-model-out" in text


def test_named_problems_build_at_the_batch_asked_and_a_name_not_in_the_zoo_is_one_error(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("# squeeze-excite\nmixnet_s.blocks.4.0.se.conv_reduce.n32 bf16\n")
    [(name, p)] = zoo_tune._named(str(names), 64)
    assert name == "mixnet_s.blocks.4.0.se.conv_reduce.n64" and p.batch == 64 and p.dtype == "bf16"
    assert zoo_tune._named(str(names), None)[0][1].batch == 32
    names.write_text("mixnet_s.blocks.4.0.se.conv_reduce.n32 f32\n")
    with pytest.raises(ValueError, match=r"--names: .*not a zoo problem and type: mixnet_s.*n32 f32"):
        zoo_tune._named(str(names), None)
    assert zoo_tune.main(["compile", "--out", str(tmp_path / "o"), "--batch", "64", "--count", "3"]) == 1


def test_the_reports_rate_counts_every_problem_the_runs_timed_a_re_measured_one_included(tmp_path):
    _slices(tmp_path)  # 35 and 30 problems, 5 of them in both, each file's runs 1 s
    out = tmp_path / "report"
    assert zoo_tune.main(["report", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "65 problems timed in 2 s" in text and "**1950.0 problems a minute**" in text
    assert "| all | 60 |" in text  # the tables count each problem once


def test_a_problem_measured_twice_keeps_the_rows_of_the_folder_named_first_and_an_empty_folder_is_an_error(tmp_path):
    rows = _slices(tmp_path)  # s0: problems 0-29, s1: 25-59
    s1 = json.loads((tmp_path / "s1" / "results.json").read_text())
    for row in s1["problems"]:
        row["contenders"]["cudnn"]["kernel_s"] = 7e-6  # the re-measure: s1's rows must win where named first
    (tmp_path / "s1" / "results.json").write_text(json.dumps(s1))
    out = tmp_path / "report"
    assert zoo_tune.main(["report", str(tmp_path / "s1"), str(tmp_path / "s0"), "--out", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    cudnn = {r["key"].split("-", 1)[1]: r["contenders"]["cudnn"]["kernel_s"] for r in merged["problems"]}
    assert len(cudnn) == len(rows) and sum(t == 7e-6 for t in cudnn.values()) == 35
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"results: .*empty: no results.json found"):
        zoo_tune.results_files([str(tmp_path / "s0"), str(tmp_path / "empty")])


def test_the_plans_losses_count_the_tuned_models_only_and_a_plan_not_timed_is_counted_apart(tmp_path):
    from convbw_mlir.dispatch.generalize import read_models, read_split

    rows = _slices(tmp_path)  # the plan's own variant 1.5x the best on every problem
    rows[0]["contenders"].pop("convbw[heuristic]")  # the plan not timed there
    results = _results(rows)
    models, split = read_models("zoo"), read_split(zoo_tune.SPLIT)
    got = zoo_tune.plan_rows(results, split, models)
    tuned = [r for r in got if not r["held_out"]]
    assert len(got) == 60 and not got[0]["measured"] and all(r["measured"] for r in got[1:])
    assert all(r["ratio"] > 1.3 for r in got[1:]) and all(r["move"] != "same plan" for r in got[1:])
    text = zoo_tune.misranks(got)
    lost = sum(r["measured"] for r in tuned)
    assert f"where today's plan was timed: {lost} ({1 - got[0]['held_out']} not:" in text
    assert f"slower than the best on {lost}." in text
    assert "| kernel | wgmma |" in text or "| kernel | mma.sync |" in text


def _compile_args(tmp_path, *extra: str) -> list[str]:
    return ["compile", "--start", "600", "--count", "2", "--chunk", "2", "--out", str(tmp_path / "out"), *extra]


def test_compile_cubin_hands_the_builds_children_ptxas_and_without_it_builds_nothing(tmp_path, monkeypatch, capsys):
    import os
    import stat

    from convbw_mlir.build import cubin
    from convbw_mlir.dispatch import tune

    seen = []
    monkeypatch.setattr(tune, "compile_candidates", lambda problems, *a, **kw: seen.append(
        (len(problems), os.environ.get(cubin.PTXAS_ENV))))  # fmt: skip
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.parent.mkdir()
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(ptxas.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(ptxas.parent))  # `1` finds this one
    monkeypatch.setenv(cubin.PTXAS_ENV, "")  # the first record keeps the original: undone last, it is restored
    monkeypatch.delenv(cubin.PTXAS_ENV)  # (compile --cubin sets it in this process: it must not leak to later tests)
    assert zoo_tune.main(_compile_args(tmp_path, "--cubin")) == 0
    assert seen == [(2, str(ptxas))]
    monkeypatch.delenv(cubin.PTXAS_ENV)
    assert zoo_tune.main(_compile_args(tmp_path / "ptx")) == 0  # without --cubin: PTX, the variable untouched
    assert seen[-1] == (2, None)
    monkeypatch.setenv(cubin.PTXAS_ENV, str(tmp_path / "nowhere"))
    assert zoo_tune.main(_compile_args(tmp_path / "none", "--cubin")) == 1
    assert "CONVBW_PTXAS=" in capsys.readouterr().err and not (tmp_path / "none").exists()


def _chunk(folder, names: list[str], target: str = "sm_90a") -> None:
    """A compile chunk's folder: a manifest of ``names`` (keys from 000), a vmfb each and a launch folder."""
    folder.mkdir(parents=True)
    problems = []
    for i, name in enumerate(names):
        key = f"{i:03d}-{name}.f16"
        (folder / f"{key}.v0.vmfb").write_bytes(b"vmfb")
        (folder / f"{key}.v0.launch").mkdir()
        contenders = {"reference": {"ok": True, "vmfb": f"{key}.v0.vmfb"},
                      "convbw[heuristic]": {"ok": True, "vmfb": f"{key}.v0.vmfb", "launch": f"{key}.v0.launch"},
                      "convbw[k_batch=2]": {"ok": False, "error": "did not build"}}  # fmt: skip
        problems.append(
            {"name": name, "key": key, "held_out": False, "problem": {"groups": 1}, "contenders": contenders}
        )
    manifest = {"target": target, "date": "2026-12-06", "iree_version": "3.13.0", "problems": problems,
                "build": {"engine": "local", "workers": 2, "wall_s": 10.0, "kernels": 2 * len(names)}}  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_merge_makes_one_manifest_whose_kernels_the_tuner_finds_in_the_chunks(tmp_path):
    from convbw_mlir.dispatch.tune import _located
    from convbw_mlir.measure.run import manifest_entries, read_manifest

    _chunk(tmp_path / "zoo" / "c00", ["a", "b"])
    _chunk(tmp_path / "zoo" / "c01", ["c"])
    zoo = tmp_path / "zoo"
    assert zoo_tune.main(["merge", str(zoo / "c00"), str(zoo / "c01"), "--out", str(zoo / "all")]) == 0
    (tmp_path / "moved").mkdir()
    (tmp_path / "zoo").rename(tmp_path / "moved" / "zoo")  # unpacked elsewhere: the paths are relative
    folder = (tmp_path / "moved" / "zoo" / "all").resolve()
    manifest = read_manifest(folder)
    entries = manifest_entries(manifest, folder)
    assert [e.key for e in entries] == ["000-a.f16", "001-b.f16", "002-c.f16"]
    assert manifest["chunks"] == ["../c00", "../c01"] and manifest["build"]["kernels"] == 6
    files = [Path(v) for e in entries for r in e.contenders.values() if r["ok"] for v in _located(folder, r).values()
             if isinstance(v, str) and v.startswith("/")]  # fmt: skip
    assert len(files) == 9 and all(f.exists() for f in files)
    assert files[-1].parent.name == "c01" and files[-1].name == "000-c.f16.v0.launch"


def test_merge_refuses_a_problem_twice_and_chunks_of_another_target_writing_nothing(tmp_path, capsys):
    _chunk(tmp_path / "c00", ["a", "b"])
    _chunk(tmp_path / "c01", ["b"])
    _chunk(tmp_path / "c02", ["c"], target="sm_80")
    for other, why in (("c01", "b.f16 is in .*c00 and in .*c01"), ("c02", "c02: target 'sm_80', the first chunk's")):
        argv = ["merge", str(tmp_path / "c00"), str(tmp_path / other), "--out", str(tmp_path / "all")]
        assert zoo_tune.main(argv) == 1
        assert re.search(why, capsys.readouterr().err) and not (tmp_path / "all").exists()
