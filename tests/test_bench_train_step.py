"""bench/train_step.py (issue 37's whole-model table): the table and its verdicts from a results folder, rows not
measured named with why, and the kernel list re-batched from one recorded at another batch. No GPU: the rows are
written here as ``part`` writes them."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

ts = bench_script("train_step")


def _row(model: str, batch: int, mode: str, ratio: float, spread: float = 1.0, **extra) -> dict:  # noqa: ANN003
    side = {"step_ms": 20.0, "host_ms": 15.0, "loss": [7.0, 6.5, 6.0]}
    calls = {"ours": 20.0, "torch: slower than torch's (benchmark)": 30.0, "C++ graph launches": 0.7}
    return {"model": model, "batch": batch, "mode": mode, "device": "NVIDIA H100 80GB HBM3",
            "torch_version": "2.11.0", "native": False, "torch": side, "torch2": side,
            "ours_bench": side | {"loss": [7.0, 6.5, 6.06]}, "ratio_ours_bench": ratio, "ratio_torch2": spread,
            "host_us_per_call_ours_bench": 40.0, "calls_per_step": {"ours_bench": calls},
            "device_ms_per_step": {"torch": {"wgrad": 1.0, "dgrad": 0.5, "other": 10.0},
                                   "ours_bench": {"ours": 0.6, "wgrad": 0.3, "dgrad": 0.5, "other": 10.0}},
            **extra}  # fmt: skip


def _write(folder, rows: list[dict]) -> None:
    for r in rows:
        (folder / f"{r['model']}_{r['batch']}_{r['mode']}.json").write_text(json.dumps(r))


def test_goal_allows_torchs_own_spread_and_names_the_excess():
    assert ts.goal(1.004, 0.995) == "yes"  # torch's second copy 0.5% off its first: ours may be too
    assert ts.goal(1.02, 1.0) == "no (+2.0%)"
    assert ts.goal(0.89, 1.01) == "yes, <= 0.90x"
    assert ts.goal(float("nan"), 1.0) == "-"  # the side was not run


def test_table_orders_rows_by_mode_and_lists_only_torchs_reasons(tmp_path):
    _write(tmp_path, [_row("resnet50", 64, "reduce-overhead", 0.95), _row("resnet50", 64, "eager", 1.05),
                      _row("resnet50", 64, "compile", 1.0, spread=1.01)])  # fmt: skip
    rows, missing = ts.results(tmp_path)
    assert [r["mode"] for r in rows] == ["eager", "compile", "reduce-overhead"] and not missing
    text = ts.render(rows, missing)
    assert "| resnet50 | 64 | eager | 20.00 | 1.000 | nan | 1.050 | no (+5.0%) |" in text
    assert "| 20 (slower than torch's (benchmark) 30) |" in text
    assert "| reduce-overhead |" in text and text.count("replays uncounted") == 1  # calls: none of the graphs'
    assert "C++ graph launches" not in text  # a counter, not a reason a call stayed torch's
    assert "1.0e-02 / 0.0e+00 (3)" in text  # losses: largest relative difference over the 3 steps
    assert "0.00, 1.00, 0.50, 10.00 | - | 0.60, 0.30, 0.50, 10.00" in text  # device ms by kind, ours not run


def test_rows_not_measured_are_named_with_their_error_timeout_or_skip(tmp_path):
    _write(tmp_path, [_row("unet_sd", 64, "eager", 1.0)])
    (tmp_path / "unet_sd_128_eager.log").write_text("Traceback\ntorch.OutOfMemoryError: CUDA out of memory.\n  x\n")
    (tmp_path / "unet_sd_64_compile.log").write_text("step 3\ntimed out after 120 s\n")
    (tmp_path / "unet_sd_64_compile.json").write_text('{"model": "unet_sd", "ba')  # killed while writing
    (tmp_path / "r3d_18_8_compile.skipped").write_text("est 90 s, 40 s left\n")
    (tmp_path / "unet_sd_64_eager.log").write_text("done\n")  # measured: its log is no missing row
    rows, missing = ts.results(tmp_path)
    assert [(r["model"], r["batch"]) for r in rows] == [("unet_sd", 64)]
    assert dict(missing) == {"r3d_18_8_compile": "est 90 s, 40 s left",
                             "unet_sd_128_eager": "torch.OutOfMemoryError: CUDA out of memory.",
                             "unet_sd_64_compile": "timed out after 120 s"}  # fmt: skip
    assert "not measured: r3d_18_8_compile (est 90 s, 40 s left); unet_sd_128_eager" in ts.render(rows, missing)


def test_problems_recorded_at_one_batch_are_rebatched_except_3d(tmp_path):
    d2 = {"groups": 1, "batch": 64, "in_channels": 64, "out_channels": 64, "input_size": [56, 56],
          "filter_size": [1, 1], "stride": [1, 1], "dilation": [1, 1], "pad_low": [0, 0], "pad_high": [0, 0],
          "dtype": "bf16", "dw_dtype": "bf16", "layout": "NHWGC/GKYXC/NHWGK"}  # fmt: skip
    d3 = d2 | {"batch": 8, "input_size": [8, 28, 28], "filter_size": [3, 3, 3], "stride": [1, 1, 1],
               "dilation": [1, 1, 1], "pad_low": [1, 1, 1], "pad_high": [1, 1, 1],
               "layout": "NDHWGC/GKZYXC/NDHWGK"}  # fmt: skip
    for name, d in (("a", d2), ("b", d3)):  # a kernel folder as compile leaves it
        (tmp_path / "sm_90a" / name).mkdir(parents=True)
        (tmp_path / "sm_90a" / name / "op.json").write_text(json.dumps({"problem": d}))
    got = ts._problems(tmp_path, [32, 128])
    assert sorted(p.batch for p in got.values() if len(p.input_size) == 2) == [32, 128]
    assert [p.batch for p in got.values() if len(p.input_size) == 3] == [8]  # R3D-18 runs at 8 at every batch
    (tmp_path / "list.json").write_text(json.dumps([d2]))  # record's list, as recorded
    assert [p.batch for p in ts._problems(tmp_path / "list.json", None).values()] == [64]
    twins = ts._problems(tmp_path / "list.json", None, both_formats=True)  # for torch.compile's other formats
    assert sorted(n[-2:] for n in twins) == ["l2", "l4"] and {p.batch for p in twins.values()} == {64}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--out", "o", "--modes", "eager,eagr"], "--modes"),
        (["run", "--out", "o", "--warmup", "50"], "--warmup"),
    ],
)
def test_bad_modes_or_warmup_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        ts.main(argv)
    assert message in capsys.readouterr().err


def test_run_logs_a_row_past_its_timeout_and_goes_on_to_the_next(tmp_path, monkeypatch, capsys):
    import subprocess

    started = []

    def fake_run(cmd, **kw):  # noqa: ANN001, ANN003, ANN202
        started.append(cmd[cmd.index("--mode") + 1])
        if started[-1] == "eager":  # the child is killed by subprocess.run at the timeout, which then raises
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"step 3\n", stderr=None)
        return subprocess.CompletedProcess(cmd, 0, "done\n", "")

    monkeypatch.setattr(ts.subprocess, "run", fake_run)
    ts.main(["run", "--out", str(tmp_path), "--models", "wav2vec2_fe", "--modes", "eager,compile", "--timeout", "7"])
    assert started == ["eager", "compile"]  # before: the timeout's exception ended the run at its first row
    assert (tmp_path / "wav2vec2_fe_64_eager.log").read_text() == "step 3\n\ntimed out after 7 s\n"
    assert (
        "not measured: wav2vec2_fe_64_compile (done); wav2vec2_fe_64_eager (timed out after 7 s)"
        in capsys.readouterr().out
    )


def test_alone_runs_each_sides_steps_in_a_row_where_in_turns_interleaves_them():
    assert ts.order(["torch", "ours"], 2, alone=False) == [(0, "torch"), (0, "ours"), (1, "torch"), (1, "ours")]
    assert ts.order(["torch", "ours"], 2, alone=True) == [(0, "torch"), (1, "torch"), (0, "ours"), (1, "ours")]


def test_hot_path_totals_count_direct_kernels_and_an_older_wheels_missing_keys_as_zero():
    kernels = [{"path": "direct", "graphs": 2, "maps_encoded": 5, "maps_slots": 3},
               {"path": "direct", "graphs": 1},  # a wheel before the map slots: no maps_slots, no maps_encoded
               {"path": "iree"}]  # fmt: skip
    assert ts.hot_path(kernels, 7) == {"maps encoded": 5, "map slots held": 3, "graph captures": 3, "C++ launches": 7}
    older = ts.hot_path(kernels[1:], 0)  # a wheel before the slots reports none: unknown, not 0
    assert older["map slots held"] is None and ts.hot_path([{"path": "iree"}], 0)["map slots held"] == 0


def test_table_shows_the_hot_path_a_step_and_names_alone_and_forced_slots_beside_the_default_row(tmp_path):
    hot = {"maps encoded": 0.5, "map slots held": 12, "graph captures": 0.25, "C++ launches": 0}
    older = hot | {"map slots held": None}
    turns = _row("resnet50", 64, "eager", 1.0, hot_path_per_step={"ours_bench": hot}, alone=False, map_slots=None)
    alone = _row("resnet50", 64, "eager", 0.98, hot_path_per_step={"ours_bench": older}, alone=True, map_slots=2)
    old = _row("convnext_t", 64, "eager", 1.0)  # written before the counters
    _write(tmp_path, [old])
    for r in (turns, alone):
        (tmp_path / f"{ts.row_stem(r['model'], r['batch'], r['mode'], r['alone'], r['map_slots'])}.json").write_text(
            json.dumps(r)
        )
    (tmp_path / "resnet50_64_compile_alone.log").write_text("RuntimeError: boom\n")  # started, no JSON
    rows, missing = ts.results(tmp_path)
    assert [ts.label(r) for r in rows] == ["eager", "eager", "eager alone slots=2"]  # both resnet50 rows kept
    assert missing == [("resnet50_64_compile_alone", "RuntimeError: boom")]
    text = ts.render(rows, missing)
    assert "| resnet50 | 64 | eager | 20.00 |" in text  # the default row as before: packs grep it so
    assert "| resnet50 | 64 | eager alone slots=2 | 20.00 | 1.000 | nan | 0.980 |" in text
    assert "| resnet50 | 64 | eager | in turns | - | 0.5, 12, 0.25, 0 |" in text
    assert "| resnet50 | 64 | eager alone slots=2 | alone | - | 0.5, n/a, 0.25, 0 |" in text
    assert "| convnext_t | 64 | eager | in turns |" not in text  # no counters: no row in the counters' table


def test_run_passes_alone_and_map_slots_to_each_row_and_names_its_files_after_them(tmp_path, monkeypatch):
    import subprocess

    cmds = []
    monkeypatch.setattr(
        ts.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")
    )
    ts.main(["run", "--out", str(tmp_path), "--models", "wav2vec2_fe", "--alone", "--map-slots", "3"])
    assert cmds[0][-3:] == ["--alone", "--map-slots", "3"]
    assert cmds[0][cmds[0].index("--json") + 1].endswith("wav2vec2_fe_64_eager_alone_slots3.json")
    assert (tmp_path / "wav2vec2_fe_64_eager_alone_slots3.log").exists()


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_map_slots_below_one_or_not_a_number_are_refused_by_name(value, capsys):
    with pytest.raises(SystemExit):
        ts.main(["run", "--out", "o", "--map-slots", value])
    err = capsys.readouterr().err
    assert "--map-slots" in err and "whole number >= 1" in err and repr(value) in err
