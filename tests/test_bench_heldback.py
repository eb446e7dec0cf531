"""bench/heldback.py (issue 39, goals 2 and 3): the held-back rows in their order, ours = the variant a user gets,
IREE's form only where not known wrong, the run's rows carrying the plan's path and rule, and the report's goals
(no compiler, no GPU: fabricated rows)."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

from convbw_mlir.problem import ConvBwdWeightProblem as P

hb = bench_script("heldback")


def test_problems_are_the_tsvs_layers_channels_last_every_bf16_row_before_any_f16_row():
    rows = hb.problems()
    n = len(rows) // 2
    assert n == 33 and [p.dtype for _, p in rows] == ["bf16"] * n + ["f16"] * n
    assert [name for name, _ in rows[:n]] == [name for name, _ in rows[n:]]
    assert all(p.dw_dtype == p.dtype and p.layout_family == P.from_ck("2 1 1 8 8 1 1 4 4 1 1 1 1 0 0 0 0")
               .with_(layout=2).layout_family for _, p in rows)  # fmt: skip


def test_ours_is_the_variant_select_gives_a_user_with_its_path_and_rule_recorded():
    from convbw_mlir.dispatch.select import select

    for name, p in hb.problems():
        vs, extra = hb.contenders(p)
        s = select(p, hb.TARGET)
        assert vs[0].name == hb.OURS and vs[0].plan == s.variant.plan, name
        assert extra["path"] == s.path and extra["rule"].startswith(s.variant.plan.decision.rule), name
    # a chooser (the shipped learned selector on sm_90a, or a tuned neighbour), then the rule that made the plan
    chosen = [hb.contenders(p)[1] for _, p in hb.problems() if hb.contenders(p)[1]["path"] in ("learned", "nearest")]
    assert chosen and all(" > " in e["rule"] for e in chosen)


def test_iree_is_a_contender_except_where_iree_is_known_to_compute_a_wrong_dw():
    cks = ("2 1 16 64 64 3 3 48 48 1 1 1 1 1 1 1 1", "2 1 16 256 512 1 1 20 20 1 1 1 1 0 0 0 0")  # 3x3, 1x1
    three, one = (P.from_ck(ck, dtype="bf16").with_(layout=2) for ck in cks)
    vs, extra = hb.contenders(three)
    assert [v.name for v in vs] == [hb.OURS, hb.IREE] and extra["iree_note"] == ""
    vs, extra = hb.contenders(one)
    assert [v.name for v in vs] == [hb.OURS] and "wrong dW" in extra["iree_note"]


def _row(key: str, ours: float | None, cudnn: float | None, iree: float | str | None, **extra: str) -> dict:
    """A runner's row: times in µs; a string is the contender's status; None: no such contender."""
    cs = {}
    for name, t in ((hb.OURS, ours), ("cudnn", cudnn), (hb.IREE, iree)):
        if t is not None:
            cs[name] = {"status": t} if isinstance(t, str) else {"status": "ok", "kernel_s": t * 1e-6}
    return {"name": key.split("-", 1)[1].rsplit(".", 1)[0], "key": key, "contenders": cs,
            "kernel": "wgmma split 7", "path": "heuristic", "rule": "explicit-by-default"} | extra  # fmt: skip


ROWS = [
    _row("000-a.bf16", 10.0, 20.0, 30.0),  # 2.0x cuDNN, 3.0x IREE
    _row("001-b.bf16", 10.0, 5.0, 8.0),  # 0.5x cuDNN (below the floor), IREE faster
    _row("002-c.bf16", 10.0, 16.0, None, iree_note="not built: 1x1"),  # no IREE kernel (known wrong)
    _row("003-a.f16", 10.0, 12.0, "WRONG"),  # IREE wrong: not a correct form
    _row("004-b.f16", "WRONG", 12.0, 20.0),  # ours wrong: no ratio, and IREE correct: the IREE goal is missed
]


def test_summary_judges_the_geomean_the_floor_and_ours_against_every_correct_iree_kernel():
    s = hb.summary(ROWS)
    assert s["count"] == 4 and s["geomean"] == pytest.approx((2.0 * 0.5 * 1.6 * 1.2) ** 0.25)
    assert s["types"]["bf16"]["count"] == 3 and s["types"]["f16"]["geomean"] == pytest.approx(1.2)
    assert list(s["types"]) == ["bf16", "f16"]
    assert s["min"] == pytest.approx(0.5) and s["below_floor"] == ["001-b.bf16"]
    assert s["iree_compared"] == 2 and s["iree_slower"] == ["001-b.bf16"]
    assert s["no_iree"] == ["002-c.bf16", "003-a.f16"]
    assert s["wrong"] == ["004-b.f16"] and s["unmeasured"] == ["004-b.f16"]
    assert list(s["goals"].values()) == [True, False, False]  # geomean 1.18: met on these rows


def test_ours_wrong_where_iree_is_correct_misses_the_iree_goal_even_if_ours_wins_elsewhere():
    s = hb.summary([ROWS[0], ROWS[2], ROWS[4]])
    assert s["iree_slower"] == [] and s["goals"][f">= {hb.GOALS['vs_iree']}x IREE's best correct form"] is False
    assert s["goals"][f"none < {hb.GOALS['floor']}"] is False  # a WRONG kernel of ours is below every floor
    met = hb.summary([ROWS[0], ROWS[2]])
    assert list(met["goals"].values()) == [True, True, True]


def test_a_goal_without_figures_is_unmeasured_and_the_summary_keeps_its_columns():
    rows = [_row("000-a.bf16", "crashed", 5.0, "no kernel")]
    s = hb.summary(rows)
    assert list(s["goals"].values()) == [None, None, None] and s["geomean"] is None
    head, rule, line = [ln for ln in hb.report(rows).splitlines() if ln.startswith("|")][:3]
    assert head.count("|") == rule.count("|") == line.count("|") and line.endswith("unmeasured |")


def test_ours_without_a_time_where_iree_has_a_correct_one_misses_the_iree_goal():
    s = hb.summary([_row("000-a.bf16", "crashed", 5.0, 8.0)])
    assert s["iree_compared"] == 0 and s["goals"][f">= {hb.GOALS['vs_iree']}x IREE's best correct form"] is False


def test_report_writes_the_summary_line_and_a_row_a_key_with_the_plans_kernel_and_rule():
    text = hb.report(ROWS, card="NVIDIA H100 80GB HBM3", command="bash run.sh")
    lines = text.splitlines()
    assert "NVIDIA H100 80GB HBM3" in lines[0] and "Command: `bash run.sh`" in text
    summary = next(ln for ln in lines if ln.startswith("| 4 |"))
    assert summary == "| 4 | 1.18 | 0.50 | 1.17 (3) | 1.20 (1) | 1 | 1 (2) | 2 | met | MISSED | MISSED |"
    row = next(ln for ln in lines if ln.startswith("| 001-b.bf16 "))
    assert row == "| 001-b.bf16 | 10.0 | 5.0 | 0.50 | 8.0 | 0.80 | wgmma split 7 | heuristic: explicit-by-default |"
    assert "| 002-c.bf16 | 10.0 | 16.0 | 1.60 | no kernel (known wrong) | - |" in text
    assert "| 003-a.f16 | 10.0 | 12.0 | 1.20 | WRONG | - |" in text
    assert "- WRONG (ours): 004-b.f16" in text


def test_run_rows_carry_the_plans_path_rule_and_kernel(tmp_path, monkeypatch):
    """The runner's rows carry none of the entry's fields: run adds this table's (class_table.run's with FIELDS)."""
    from convbw_mlir.measure import run as runner
    from convbw_mlir.measure.records import ManifestEntry, ResultRow

    p = P.from_ck("2 1 16 64 64 3 3 48 48 1 1 1 1 1 1 1 1", dtype="bf16").with_(layout=2)
    fields = {"path": "nearest", "rule": "nearest > explicit-asked", "why": "w", "kernel": "mma.sync split 8",
              "iree_note": ""}  # fmt: skip
    entry = ManifestEntry("a", "000-a.bf16", p.to_dict(), {hb.OURS: {"ok": False, "error": "x"}}, fields)
    (tmp_path / "manifest.json").write_text(json.dumps({"target": "sm_90a", "iree_version": "3.13",
                                                        "problems": [entry.to_dict()]}))  # fmt: skip

    def fake(folder, **kw):
        row = ResultRow.head(entry, {hb.OURS: {"status": "no kernel"}})
        kw["log"](runner._line(row))
        return {"device": "H100", "problems": [row.to_dict()]}

    monkeypatch.setattr(runner, "run_manifest", fake)
    assert hb.run(tmp_path, tmp_path / "out") == 0
    row = json.loads((tmp_path / "out" / "rows.jsonl").read_text())
    assert {k: row[k] for k in fields} == fields
    assert "class" not in row


def test_an_unknown_type_is_one_error_naming_the_option_and_value(capsys):
    with pytest.raises(SystemExit) as e:
        hb.main(["select", "--types", "bf16,f32"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and "--types" in err and "'bf16,f32'" in err


def test_the_second_set_is_selectable_and_shares_no_shape_with_the_first_or_any_suite():
    from convbw_mlir.suites import SUITES_DIR, suite_names

    def shapes(text: str) -> set[tuple[str, ...]]:
        return {tuple(line.split("\t")[1].split()) for line in text.splitlines() if line.strip() and line[0] != "#"}

    second = hb.SUITE.with_name("dense2d_b.tsv")
    seen = shapes(hb.SUITE.read_text()).union(*(shapes((SUITES_DIR / f"{s}.tsv").read_text()) for s in suite_names()))
    assert len(shapes(second.read_text())) == 25 and not shapes(second.read_text()) & seen
    rows = hb.problems(("bf16",), second)
    assert len(rows) == 25 and all(p.groups == 1 and p.layout == hb.problems(("bf16",))[0][1].layout for _, p in rows)


def test_a_missing_set_is_one_error_naming_the_option(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        hb.main(["select", "--set", str(tmp_path / "none.tsv")])
    err = capsys.readouterr().err
    assert e.value.code == 1 and len(err.splitlines()) == 1 and "--set" in err and "none.tsv" in err
