"""A tuning run's phases (convbw_mlir.dispatch.tune) with a stand-in measuring server and clock, no kernels: each
problem's pass-1 row lands in ``out`` and the records as it is timed, marked while its pass 2 is due, then again
with pass 2; ``--deadline`` leaves room for the pass 2 of the problems it lets start, and a pass 2 it cuts leaves
the pass-1 row, which the database and the summary take and name as such."""

from __future__ import annotations

import json

import pytest

from convbw_mlir.dispatch import tune
from convbw_mlir.measure import server
from convbw_mlir.measure.pool import Device
from convbw_mlir.measure.records import ManifestEntry, ResultRow
from convbw_mlir.problem import ConvBwdWeightProblem

P = ConvBwdWeightProblem(1, 2, 8, 8, (6, 6), (1, 1))
HEUR, SPLIT = "convbw[heuristic]", "iree_direct"  # the heuristic's plan, and IREE's own form


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _entries(count: int) -> list[ManifestEntry]:
    from convbw_mlir.dispatch import heuristic

    contenders = {HEUR: {"ok": True, "heuristic": True, "variant": heuristic(P, "host").to_dict()},
                  SPLIT: {"ok": True, "heuristic": False}}  # fmt: skip
    problem = json.loads(json.dumps(P.to_dict()))  # as a manifest holds it
    return [ManifestEntry(f"p{i}", f"{i:03d}-p{i}.f16", problem, contenders, {"held_out": False})
            for i in range(count)]  # fmt: skip


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A stand-in ``Served`` that spends ``seconds[pass]`` of the clock a candidate and times IREE's form 4% faster
    than the heuristic's plan (close: pass 2 is due); each run records what ``out`` held as its problems came up."""
    clock, runs = Clock(), []
    out = tmp_path / "results.json"

    class Served:
        seconds = {1: 1.0, 2: 1.0}

        def __init__(self, folder, entries, options, slots, timeout_s, log=print, skip=None, pool=None):
            self.entries, self.skip, self.seen = list(entries), skip, []
            self.pass_ = 2 if options["numpy_max_flops"] == 0 else 1
            runs.append(self)

        def __iter__(self):
            for i, e in enumerate(self.entries):
                self.seen.append(json.loads(out.read_text())["problems"] if out.exists() else [])
                if self.skip is not None and self.skip(i):
                    continue
                clock.now += self.seconds[self.pass_] * len(e.contenders)
                times = {HEUR: 10e-6, SPLIT: 9.6e-6}  # within PASS2_WITHIN, past MIN_GAIN
                res = {n: {"status": "ok", "median_s": times[n], "n": 10} for n in e.contenders}
                yield i, (ResultRow.head(e, res), "local-task")

        def summary(self):
            return {"path": "server", "pass": self.pass_}

    monkeypatch.setattr(server, "Served", Served)

    def run(count: int, deadline_s: float | None = None, lines: list[str] | None = None) -> tuple[dict, list]:
        results = {"target": "host", "iree_version": "3.13", "date": "2026-12-06", "device": None, "problems": [],
                   "server": []}  # fmt: skip
        fields = {"target": "host", "iree_version": "3.13", "product_version": "0"}
        records = tune._Records(tune.records_path(out), fields)
        log = lines.append if lines is not None else (lambda _: None)
        r = tune._Run(tmp_path, out, [Device("local-task", 0)], log, 1.0, False, results, records, pool=object(),
                      deadline_s=deadline_s, clock=clock)  # fmt: skip
        tune._phases_of(r, _entries(count))
        return results, runs

    run.clock, run.out, run.served = clock, out, Served
    return run


def test_each_problems_pass1_row_lands_in_out_and_the_records_marked_then_pass2_updates_it(fake):
    results, (first, second) = fake(3)
    # as pass 1 reached problem i, out held the problems before it, each marked as awaiting its pass 2
    assert [[r["key"] for r in seen] for seen in first.seen] == [[], ["000-p0.f16"], ["000-p0.f16", "001-p1.f16"]]
    assert all(r[tune.PASS2_PENDING] == [SPLIT, HEUR] and "pass2" not in r for r in first.seen[2])
    assert all(len(seen) == 3 for seen in second.seen)  # pass 2 rewrites rows already there
    assert [set(r.get("pass2", {})) for r in second.seen[1]] == [{SPLIT, HEUR}, set(), set()]
    rows = json.loads(fake.out.read_text())["problems"]
    assert rows == results["problems"] and json.loads(fake.out.read_text()) == results
    assert all(tune.PASS2_PENDING not in r and r["pass2"].keys() == {SPLIT, HEUR} for r in rows)
    assert results["server"] == [{"path": "server", "pass": 1}, {"path": "server", "pass": 2}]
    recs = [json.loads(line) for line in tune.records_path(fake.out).read_text().splitlines()]
    assert sorted((r["key"], r["pass"], r["contender"]) for r in recs) == sorted(
        (f"{i:03d}-p{i}.f16", p, n) for i in range(3) for p in (1, 2) for n in (HEUR, SPLIT)
    )  # each candidate and pass once: a row landing twice appends only its new pass


def test_the_deadline_stops_pass1_where_the_pass2_of_the_problems_timed_still_fits(fake):
    lines: list[str] = []
    results, (first, second) = fake(6, deadline_s=10.0, lines=lines)
    # 2 s a problem in pass 1 and 2 s a pass 2: after two problems (4 s), a third and the three pass 2s need 8 more
    assert [r["key"] for r in results["problems"]] == ["000-p0.f16", "001-p1.f16"]
    assert all("pass2" in r for r in results["problems"]) and fake.clock.now <= 10.0
    assert lines == [f"deadline: {i:03d}-p{i}.f16 not timed" for i in range(2, 6)]


def test_a_pass2_the_deadline_cuts_leaves_a_pass1_row_that_the_database_and_summary_take(fake):
    fake.served.seconds = {1: 1.0, 2: 4.0}  # pass 2 far slower than pass 1 predicts: the deadline cuts it
    lines: list[str] = []
    results, _ = fake(6, deadline_s=10.0, lines=lines)
    done, cut = results["problems"]
    assert "pass2" in done and tune.PASS2_PENDING not in done
    assert cut[tune.PASS2_PENDING] == [SPLIT, HEUR] and "pass2" not in cut
    assert "deadline: 001-p1.f16: pass 2 not run (pass 1's figures stand)" in lines
    d = tune._decide(cut)
    assert d["winner"] == SPLIT and d["pass1_only"] and d["why"].endswith("; pass 1 only (its pass 2 was not run)")
    db = tune.database_from_results(json.loads(fake.out.read_text()), "results.json")
    assert len(db.entries) == 1
    assert "pass 1 only: 1 problems whose pass 2 was due and not run" in tune.summarize(results, db)


def test_the_zoo_report_takes_pass1_only_rows_and_its_database_says_so(tmp_path):
    """``bench/zoo_tune.py report`` over a results file a killed run left: rows awaiting their pass 2."""
    from conftest import bench_script

    from convbw_mlir.dispatch.db import TuningDB
    from convbw_mlir.dispatch.variants import candidates

    zoo_tune = bench_script("zoo_tune")
    rows = []
    for i, (name, p) in enumerate(zoo_tune.slice_order()[:12]):
        vs = {v.name: v for v in candidates(p, "sm_90a", max_plans=2, iree=False)}
        times = {n: 10e-6 * (1.5 if n == "convbw[heuristic]" else 1 + j / 50) for j, n in enumerate(vs)}
        contenders = {n: {"status": "ok", "median_s": 80e-6, "kernel_s": t} for n, t in times.items()}
        row = {
            "name": name,
            "key": f"{i:03d}-{name}.{p.dtype}",
            "problem": p.to_dict(),
            "contenders": contenders,
            "heuristic": "convbw[heuristic]",
            "held_out": False,
            "variants": {n: v.to_dict() for n, v in vs.items()},
        }
        row |= {tune.PASS2_PENDING: tune._pass2_names(row)} if i % 2 else {}  # fmt: skip
        rows.append(row)
    (tmp_path / "cut").mkdir()
    results = {"target": "sm_90a", "iree_version": "3.13.0", "date": "2026-12-06", "device": "NVIDIA H100 80GB HBM3",
               "problems": rows, "server": [{"wall_s": 1.0, "ended": False}]}  # fmt: skip
    (tmp_path / "cut" / "results.json").write_text(json.dumps(results))
    assert sum(bool(r.get(tune.PASS2_PENDING)) for r in rows) == 6
    assert zoo_tune.main(["report", str(tmp_path / "cut"), "--out", str(tmp_path / "report")]) == 0
    db = TuningDB.load(tmp_path / "report" / "nvidia-h100-80gb-hbm3.sm_90a.json", strict=True)
    whys = [e["why"] for e in db.entries.values()]
    assert len(whys) == 12 and sum(w.endswith("; pass 1 only (its pass 2 was not run)") for w in whys) == 6
