"""How a selection generalizes: the model split decided before tuning, the held-out report, the learned
selector (trained with scikit-learn, shipped as JSON trees, loaded without it), on synthetic results."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from convbw_mlir.dispatch import candidates
from convbw_mlir.dispatch.generalize import (
    CHOSEN,
    SelectorConfig,
    cross_validate,
    evaluate,
    is_held_out,
    model_folds,
    read_split,
    ships,
    split_by_model,
    train_selector,
    training_rows,
    write_split,
)
from convbw_mlir.dispatch.learned import FEATURES, SELECTOR_VERSION, TreeSelector, features
from convbw_mlir.problem import ConvBwdWeightProblem

MODELS = [f"net{i:02d}" for i in range(10)]


def test_the_split_holds_out_a_fifth_of_the_models_by_name_alone(tmp_path):
    split = split_by_model(MODELS)
    assert len(split["held_out"]) == 2 and set(split["held_out"]) | set(split["tuned"]) == set(MODELS)
    assert split_by_model(list(reversed(MODELS)) + MODELS[:3]) == split  # order and repeats change nothing
    write_split(tmp_path / "split.json", split)
    assert read_split(tmp_path / "split.json") == split
    held, tuned = split["held_out"][0], split["tuned"][0]
    assert is_held_out([held], split) and not is_held_out([held, tuned], split)  # a layer a tuned model shares


@pytest.mark.parametrize(
    ("models", "fraction", "message"),
    [([], 0.2, "models: expected at least one model name"), (["a"], 1.0, "fraction: expected a number between")],
)
def test_a_bad_split_request_is_one_error_naming_it(models, fraction, message):
    with pytest.raises(ValueError, match=message):
        split_by_model(models, fraction)


def test_a_file_that_is_not_a_split_is_refused_naming_it(tmp_path):
    bad = tmp_path / "s.json"
    bad.write_text('{"kind": "something"}')
    with pytest.raises(ValueError, match=r"split: .*s\.json: not a model split"):
        read_split(bad)


# -- synthetic results: a time law the GEMM view explains -------------------------------------------------
def _law(problem: ConvBwdWeightProblem, variant) -> float:
    """Seconds: the best split grows with the reduction (K / 2^13 splits), IREE's own forms are slower."""
    g, m, n, k = problem.gemm
    base = 2 * g * m * n * k / 100e12
    if variant.plan is None:
        return base * 1.6
    ideal = max(1.0, k / 2**13)
    return base * (1 + 0.35 * abs(math.log2(variant.plan.k_batch / ideal)))


def _results(count: int = 60) -> tuple[dict, dict]:
    rows, models = [], {}
    for i in range(count):
        p = ConvBwdWeightProblem.from_ck(f"2 1 {2 ** (1 + i % 7)} {64 * (1 + i % 3)} 64 3 3 {8 + 2 * (i % 5)} "
                                         f"{8 + 2 * (i % 5)} 1 1 1 1 1 1 1 1")  # fmt: skip
        name = f"p{i:03d}"
        models[name] = [MODELS[i % len(MODELS)]]
        variants = {v.name: v for v in candidates(p, "sm_80", max_plans=4)}
        contenders = {n: {"status": "ok", "median_s": _law(p, v)} for n, v in variants.items()}
        rows.append({"name": name, "problem": p.to_dict(), "contenders": contenders, "heuristic": "convbw[heuristic]",
                     "variants": {n: v.to_dict() for n, v in variants.items()}})  # fmt: skip
    results = {
        "target": "sm_80",
        "iree_version": "3.13.0",
        "date": "2026-11-25",
        "device": "synthetic",
        "problems": rows,
    }
    return results, models


def test_the_report_counts_each_selectors_choices_within_ten_percent_of_the_best():
    results, models = _results(20)
    split = {"held_out": ["net00", "net01"], "tuned": MODELS[2:]}
    report = evaluate(results, split, models=models)
    held = [r for r in results["problems"] if models[r["name"]][0] in ("net00", "net01")]
    assert report["held_out_problems"] == len(held) == 4
    ratios = []
    for r in held:
        times = {n: c["median_s"] for n, c in r["contenders"].items()}
        ratios.append(times["convbw[heuristic]"] / min(times.values()))
    h = report["selectors"]["heuristic"]
    assert h["within"] == sum(x <= 1.1 for x in ratios) and h["measured"] == 4
    assert h["geomean_loss"] == pytest.approx(math.prod(ratios) ** (1 / 4) - 1)
    assert {"select", "nearest"} <= report["selectors"].keys()


def test_product_is_what_select_gives_untuned_with_the_installed_selector(monkeypatch):
    """Goal 1 judges the untuned choice a user gets: ``product`` follows the installed selector, ``select`` not."""
    import importlib

    sel_mod = importlib.import_module("convbw_mlir.dispatch.select")

    results, models = _results(80)
    split = split_by_model(MODELS)
    monkeypatch.setattr(sel_mod, "learned_selector", lambda target: None)
    plain = evaluate(results, split, models=models)
    assert [r.get("product") for r in plain["rows"]] == [r.get("select") for r in plain["rows"]]
    trained = train_selector(results, split, models)
    monkeypatch.setattr(sel_mod, "learned_selector", lambda target: trained)
    installed = evaluate(results, split, trained, models)
    assert installed["selectors"]["product"]["within"] > plain["selectors"]["product"]["within"]


def test_plan_now_is_todays_plan_and_not_measured_where_the_run_never_timed_it():
    results, models = _results(20)
    split = {"held_out": ["net00", "net01"], "tuned": MODELS[2:]}
    now = evaluate(results, split, models=models)["selectors"]["plan now"]
    assert now == evaluate(results, split, models=models)["selectors"]["heuristic"]  # the heuristic is today's here
    for row in results["problems"]:  # a run whose plan of the day was another: today's never timed
        row["contenders"].pop("convbw[heuristic]")
        row["variants"].pop("convbw[heuristic]")
        row["heuristic"] = next(iter(row["contenders"]))
    moved = evaluate(results, split, models=models)["selectors"]
    assert "plan now" not in moved and moved["heuristic"]["measured"] == 4


def test_the_learned_selector_round_trips_as_json_and_predicts_as_scikit_learn_does(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor

    results, models = _results(30)
    split = split_by_model(MODELS)
    sel = train_selector(results, split, models, replace(CHOSEN, trees=40))
    xs, ys = training_rows(results, split, models, CHOSEN.cap)
    ref = GradientBoostingRegressor(n_estimators=40, max_depth=CHOSEN.depth, learning_rate=CHOSEN.rate,
                                    min_samples_leaf=CHOSEN.leaf, random_state=0).fit(xs, ys)  # fmt: skip
    assert sel.predict(xs) == pytest.approx(list(ref.predict(xs)), abs=1e-9)
    sel.save(tmp_path / "selector.sm_80.json")
    back = TreeSelector.load(tmp_path / "selector.sm_80.json")
    assert back.predict(xs[:20]) == sel.predict(xs[:20]) and back.meta["rows"] == len(xs)
    data = json.loads((tmp_path / "selector.sm_80.json").read_text())
    data["features"] = data["features"][:-1]
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="trained on other features than this version's"):
        TreeSelector.load(tmp_path / "old.json")


def test_a_selector_that_learned_the_law_beats_nearest_neighbour_and_ships():
    results, models = _results(80)
    split = split_by_model(MODELS)
    report = evaluate(results, split, train_selector(results, split, models), models)
    s = report["selectors"]
    assert s["learned"]["within_rate"] >= 0.85 and s["learned"]["geomean_loss"] < s["heuristic"]["geomean_loss"]
    assert ships(report) == all(
        (s["learned"]["within_rate"], -s["learned"]["geomean_loss"]) > (s[b]["within_rate"], -s[b]["geomean_loss"])
        for b in ("nearest", "heuristic")
    )


def test_a_selector_that_beats_nearest_but_not_the_heuristic_does_not_ship():
    def rates(within, loss):
        return {"within_rate": within, "geomean_loss": loss}

    s = {"learned": rates(0.8, 0.05), "nearest": rates(0.7, 0.08), "heuristic": rates(0.85, 0.04)}
    assert not ships({"selectors": s})
    assert ships({"selectors": s | {"heuristic": rates(0.8, 0.06)}})


def test_ships_only_when_learned_beats_nearest():
    def report(learned, nearest):
        keys = ("within_rate", "geomean_loss")
        return {"selectors": {"learned": dict(zip(keys, learned)), "nearest": dict(zip(keys, nearest)),
                              "heuristic": {"within_rate": 0.0, "geomean_loss": 9.0}}}  # fmt: skip

    assert ships(report((0.9, 0.05), (0.8, 0.01)))
    assert not ships(report((0.8, 0.05), (0.9, 0.01)))
    assert ships(report((0.9, 0.02), (0.9, 0.03))) and not ships(report((0.9, 0.03), (0.9, 0.03)))
    assert not ships({"selectors": {"nearest": {"within_rate": 0.1, "geomean_loss": 1.0}}})  # none trained


def test_features_name_the_gemm_view_and_the_variants_choices():
    p = ConvBwdWeightProblem.from_ck("2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1")
    (heur, *_rest) = candidates(p, "sm_80")
    row = dict(zip(FEATURES, features(p, heur)))
    assert row["log2_m"] == 6 and row["log2_n"] == math.log2(64 * 9) and row["log2_k"] == math.log2(32 * 196)
    assert row["strategy_explicit"] == 1 and row["log2_k_batch"] == math.log2(heur.plan.k_batch)


def test_an_installed_selector_chooses_after_an_exact_hit_and_a_database_folder_ignores_it(tmp_path, monkeypatch):
    import warnings

    from convbw_mlir.dispatch.select import databases, select

    results, models = _results(40)
    split = split_by_model(MODELS)
    sel = train_selector(results, split, models, replace(CHOSEN, trees=60))
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    p = ConvBwdWeightProblem.from_ck("2 1 16 128 64 3 3 12 12 1 1 1 1 1 1 1 1")
    assert select(p, "sm_80", dbs=[]).path == "heuristic"  # none installed
    (tmp_path / "cache" / "tuning").mkdir(parents=True)
    sel.save(tmp_path / "cache" / "tuning" / "selector.sm_80.json")
    got = select(p, "sm_80", dbs=[])
    options = [v for v in candidates(p, "sm_80", iree=False)]
    assert got.path == "learned" and got.variant == sel.choose(p, options)
    assert select(p, "sm_80", dbs=[], selector=False).path == "heuristic"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the selector file is not read as a malformed database
        assert databases("sm_80") == [d for d in databases("sm_80") if d.target == "sm_80"]


def test_the_command_splits_before_tuning_and_reports_after(tmp_path, capsys):
    from convbw_mlir.dispatch.generalize import main

    results, models = _results(40)
    (tmp_path / "models.json").write_text(json.dumps(models))
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["split", "--models", str(tmp_path / "models.json"), "--out", str(tmp_path / "split.json")]) == 0
    assert read_split(tmp_path / "split.json") == split_by_model(MODELS)
    argv = ["evaluate", str(tmp_path / "results.json"), "--split", str(tmp_path / "split.json"), "--models",
            str(tmp_path / "models.json"), "--out", str(tmp_path / "report.md"),
            "--selector-out", str(tmp_path / "selector.sm_80.json")]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert "| learned |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "selector.sm_80.json").exists() == ships(report)
    argv[3] = str(tmp_path / "results.json")  # not a split
    assert main(argv) == 1 and capsys.readouterr().err.startswith("error: split: ")


def test_the_committed_zoo_split_is_the_one_the_names_decide():
    """bench/zoo_split.json was written before the zoo's tuning (issue 39); recomputing it changes nothing."""
    from pathlib import Path

    from convbw_mlir.dispatch.generalize import read_models

    models = read_models("zoo")
    split = read_split(Path(__file__).parent.parent / "bench" / "zoo_split.json")
    assert split == split_by_model([m for ms in models.values() for m in ms])
    assert len(split["held_out"]) == 9 and sum(is_held_out(ms, split) for ms in models.values()) == 160


def test_models_that_are_neither_a_map_nor_a_suite_are_one_error_naming_them(tmp_path):
    from convbw_mlir.dispatch.generalize import read_models

    bad = tmp_path / "m.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"models: .*m\.json: expected an object"):
        read_models(str(bad))
    with pytest.raises(ValueError, match="models: suite: nope is neither"):
        read_models("nope")


# -- leave-model-out cross-validation on the tuned models (issue 39 goal 1) ------------------------------------
def test_folds_deal_the_tuned_models_alone_by_name_and_a_bad_count_is_one_error():
    split = split_by_model(MODELS)
    folds = model_folds(split, 4)
    assert sorted(m for f in folds for m in f) == sorted(split["tuned"]) and len(folds) == 4
    assert model_folds(dict(split, tuned=list(reversed(split["tuned"]))), 4) == folds  # the names decide
    for bad in (1, len(split["tuned"]) + 1):
        with pytest.raises(ValueError, match=f"folds: expected 2 to {len(split['tuned'])}.*got {bad}"):
            model_folds(split, bad)


class _Spy:
    """A trainer that records the rows it was given and chooses by ``pick`` (variants, problem) -> index."""

    def __init__(self, pick):
        self.pick, self.seen = pick, []

    def __call__(self, results, split, models):
        self.seen.append({r["name"] for r in results["problems"]})
        return self

    def choose(self, problem, variants):
        return variants[self.pick(problem, variants)]


def test_cross_validation_never_reads_a_held_out_row():
    results, models = _results(60)
    split = split_by_model(MODELS)
    held = {r["name"] for r in results["problems"] if is_held_out(models[r["name"]], split)}
    for r in results["problems"]:
        if r["name"] in held:  # read, it would fail: not a problem
            r["problem"] = r["contenders"] = r["variants"] = None
    spy = _Spy(lambda p, vs: 0)
    cv = cross_validate(results, split, models, folds=4, train=spy)
    assert len(spy.seen) == 4 and held and not any(held & seen for seen in spy.seen)
    scored = {r["name"] for r in cv["rows"]}
    assert not scored & held and scored == {r["name"] for r in results["problems"]} - held  # each tuned one once
    for f, fold in enumerate(model_folds(split, 4)):  # a problem is scored in its model's fold, never trained on there
        assert {r["name"] for r in cv["rows"] if r["fold"] == f} == {n for n in scored if models[n][0] in fold}
        assert not {n for n in scored if models[n][0] in fold} & spy.seen[f]


def test_cross_validation_scores_what_the_goal_scores():
    results, models = _results(40)
    split = split_by_model(MODELS)
    fastest = _Spy(lambda p, vs: min(range(len(vs)), key=lambda i: _law(p, vs[i])))
    oracle = cross_validate(results, split, models, train=fastest)
    assert oracle["selectors"]["learned"] | {"within": 0} == {"within": 0, "measured": oracle["problems"],
                                                               "within_rate": 1.0, "geomean_loss": 0.0,
                                                               "not_measured": 0}  # fmt: skip
    # choosing the first candidate (the heuristic's) scores exactly as the heuristic does: within 10%, geomean loss
    first = cross_validate(results, split, models, train=_Spy(lambda p, vs: 0))["selectors"]
    assert first["learned"] == first["heuristic"] and first["heuristic"]["within_rate"] < 1
    ratios = []
    for r in results["problems"]:
        if not is_held_out(models[r["name"]], split):
            times = {n: c["median_s"] for n, c in r["contenders"].items()}
            ratios.append(times["convbw[heuristic]"] / min(times.values()))
    assert first["heuristic"]["within"] == sum(x <= 1.1 for x in ratios)
    assert first["heuristic"]["geomean_loss"] == pytest.approx(math.prod(ratios) ** (1 / len(ratios)) - 1)


def test_the_cv_command_scores_the_chosen_config_and_refuses_a_bad_one(tmp_path, capsys):
    from convbw_mlir.dispatch.generalize import main

    results, models = _results(80)
    (tmp_path / "models.json").write_text(json.dumps(models))
    (tmp_path / "results.json").write_text(json.dumps(results))
    write_split(tmp_path / "split.json", split_by_model(MODELS))
    argv = ["cv", str(tmp_path / "results.json"), "--split", str(tmp_path / "split.json"), "--models",
            str(tmp_path / "models.json"), "--out", str(tmp_path / "cv.md"), "--trees", "100"]  # fmt: skip
    assert main(argv) == 0
    s = json.loads((tmp_path / "cv.json").read_text())["selectors"]
    assert s["learned"]["within_rate"] >= 0.85 and s["learned"]["geomean_loss"] < s["heuristic"]["geomean_loss"]
    assert "| learned |" in (tmp_path / "cv.md").read_text()
    assert main([*argv, "--folds", "1"]) == 1 and capsys.readouterr().err.startswith("error: folds: expected 2 to")
    assert main([*argv, "--cap", "0.5"]) == 1 and "error: selector config: cap:" in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value"), [("trees", 0), ("depth", 2.5), ("leaf", 0), ("rate", 0.0), ("cap", 1.0)])
def test_a_bad_selector_config_is_one_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"selector config: {field}: expected .* got {value!r}"):
        SelectorConfig(**{field: value})


def test_a_capped_target_stops_at_the_cap():
    results, models = _results(20)
    _, ys = training_rows(results, None, models)
    _, capped = training_rows(results, None, models, cap=1.3)
    assert max(ys) > math.log(1.3) and max(capped) == pytest.approx(math.log(1.3))
    assert [min(y, math.log(1.3)) for y in ys] == pytest.approx(capped)


def test_derived_features_count_waves_over_the_targets_sm_count(monkeypatch):
    import dataclasses

    from convbw_mlir import targets

    p = ConvBwdWeightProblem.from_ck("2 1 32 96 64 3 3 14 14 1 1 1 1 1 1 1 1")  # N=32, K=96, C=64, 3x3
    v = next(v for v in candidates(p, "sm_80", max_plans=4) if v.plan is not None and v.plan.tile is not None)
    t = v.plan.tile
    workgroups = math.ceil(96 / t.m) * math.ceil(64 / t.n) * 9 * v.plan.k_batch
    row = dict(zip(FEATURES, features(p, v)))
    sms = targets.get_target("sm_80").compute_units
    assert row["log2_waves"] == pytest.approx(math.log2(workgroups / sms))
    assert row["last_wave_fill"] == pytest.approx((workgroups % sms or sms) / sms)
    assert row["log2_k_steps"] == pytest.approx(math.log2(32 * 196 / (v.plan.k_batch * t.k)))
    assert row["tile_fill"] == pytest.approx(96 * 64 / (math.ceil(96 / t.m) * t.m * math.ceil(64 / t.n) * t.n))
    assert row["channels_odd"] == 0 and row["log2_intensity"] == pytest.approx(math.log2(p.flops / p.min_bytes))
    half = dataclasses.replace(targets.TARGETS["sm_80"], compute_units=sms // 2)
    monkeypatch.setitem(targets.TARGETS, "sm_80", half)  # the SM count is the target table's, not a literal
    assert dict(zip(FEATURES, features(p, v)))["log2_waves"] == pytest.approx(row["log2_waves"] + 1)


def test_a_selector_file_of_the_old_version_is_ignored_with_a_warning(tmp_path, monkeypatch):
    from convbw_mlir.dispatch.select import learned_selector

    results, models = _results(20)
    sel = train_selector(results, split_by_model(MODELS), models, replace(CHOSEN, trees=5))
    old = dict(sel.to_dict(), version=SELECTOR_VERSION - 1)
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "selector.sm_80.json").write_text(json.dumps(old))
    with pytest.warns(UserWarning, match=f"version {SELECTOR_VERSION - 1}, this version reads {SELECTOR_VERSION}"):
        assert learned_selector("sm_80") is None  # no sm_80 selector ships: the old file is the only one


def test_the_selector_keeps_the_plans_matrix_instruction_however_it_scores_another():
    """A selector that predicts the sm_80 kernel fastest on a problem the plan gives the wgmma kernel still returns
    a wgmma variant (the second held-back set: each such switch of the selector's ran 1.3-3.2x longer)."""
    from convbw_mlir.dispatch.learned import instruction_family

    p = ConvBwdWeightProblem(groups=1, batch=16, in_channels=256, out_channels=512, input_size=(20, 20),
                             filter_size=(3, 3), pad_low=(1, 1), pad_high=(1, 1), dtype="f16")  # fmt: skip
    vs = candidates(p, "sm_90a", iree=False)
    fams = [instruction_family(v) for v in vs]
    assert fams[0] == "NV_WGMMA" and "NV_MMA_SYNC" in fams  # the plan's kernel and the sm_80 one among them
    sync = {tuple(features(p, v, "sm_90a")) for v, f in zip(vs, fams) if f == "NV_MMA_SYNC"}
    assert not sync & {tuple(features(p, v, "sm_90a")) for v, f in zip(vs, fams) if f != "NV_MMA_SYNC"}

    class PrefersTheSm80Kernel(TreeSelector):
        def predict(self, rows):
            return [-1.0 if tuple(r) in sync else 0.0 for r in rows]

    sel = PrefersTheSm80Kernel("sm_90a", 0.0, 1.0, [])
    assert instruction_family(sel.choose(p, vs)) == "NV_WGMMA"
