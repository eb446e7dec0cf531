"""Tuning database round trip, merge, versions and malformed files; select's three paths; compile_op through select."""

from __future__ import annotations

import json
import time

import pytest

from convbw_mlir import compile_op
from convbw_mlir.dispatch import DatabaseError, TuningDB, Variant, candidates, distance, heuristic, select
from convbw_mlir.dispatch.db import db_file_name
from convbw_mlir.dispatch.select import databases
from convbw_mlir.problem import ConvBwdWeightProblem

TUNED = ConvBwdWeightProblem.from_ck("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1")
NEAR = TUNED.with_(batch=128)  # half the reduction: distance 1
FAR = ConvBwdWeightProblem.from_ck("2 1 2 2048 16 3 3 7 7 1 1 1 1 1 1 1 1")
GROUPED = ConvBwdWeightProblem.from_ck("2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1")


def _db(iree: str = "3.13.0") -> TuningDB:
    db = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", iree)
    winner = next(v for v in candidates(TUNED, "sm_80") if v.options == (("k_batch", 32),))
    db.add(TUNED, winner, median_s=1e-3, why="fastest correct")
    db.add(GROUPED, Variant("iree_fusilli"), median_s=2e-4, why="fastest correct")
    return db


def test_database_round_trips_through_json_and_merges_the_faster_entry(tmp_path):
    db = _db()
    path = db.save(tmp_path / db_file_name(db.device, db.target))
    assert path.name == "nvidia-h100-80gb-hbm3.sm_80.json"
    back = TuningDB.load(path, "3.13.0")
    assert back.entries == db.entries and back.device == db.device
    other = TuningDB(db.device, "sm_80", "3.13.0")
    other.add(TUNED, heuristic(TUNED, "sm_80"), median_s=2e-3)  # slower: not taken
    other.add(NEAR, heuristic(NEAR, "sm_80"), median_s=5e-4)  # new: taken
    assert back.merge(other) == 1 and len(back.entries) == 3
    assert back.lookup(TUNED)["median_s"] == 1e-3
    with pytest.raises(DatabaseError, match="target differs"):
        back.merge(TuningDB(db.device, "gfx942", "3.13.0"))


def test_a_database_of_another_iree_version_is_ignored_with_a_warning(tmp_path):
    path = _db("3.12.0").save(tmp_path / "x.sm_80.json")
    with pytest.warns(UserWarning, match="IREE 3.12.0.*ignored"):
        assert TuningDB.load(path, "3.13.0") is None


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: "{", "not JSON"),
        (lambda d: json.dumps({**d, "kind": "x"}), "not a convbw-mlir tuning database"),
        (lambda d: json.dumps({**d, "format": 9}), "format 9"),
        (lambda d: json.dumps({k: v for k, v in d.items() if k != "device"}), "missing field 'device'"),
        (lambda d: json.dumps({**d, "entries": [{**d["entries"][0], "variant": {"form": "x"}}]}), r"entries\[0\]"),
    ],
)
def test_malformed_databases_are_one_error_naming_what(mutate, message):
    data = json.loads(_db().to_json())
    with pytest.raises(DatabaseError, match=message):
        TuningDB.parse(mutate(data), "db.json")


def test_select_takes_an_exact_hit_then_the_nearest_then_the_heuristic():
    dbs = [_db()]
    exact = select(TUNED, "sm_80", dbs=dbs)
    assert exact.path == "exact" and exact.variant.plan.k_batch == 32
    near = select(NEAR, "sm_80", dbs=dbs)
    assert near.path == "nearest" and near.variant.plan.k_batch == 32 and "distance 1.00" in near.why
    assert distance(NEAR, TUNED) == 1.0
    far = select(FAR, "sm_80", dbs=dbs)
    assert far.path == "heuristic" and far.variant == heuristic(FAR, "sm_80")
    assert select(GROUPED, "sm_80", dbs=dbs).variant.form == "iree_fusilli"  # exact: verified there


def test_iree_forms_never_transfer_to_a_neighbour():
    near_grouped = GROUPED.with_(batch=16)
    sel = select(near_grouped, "sm_80", dbs=[_db()])
    assert sel.path == "heuristic" and sel.variant.form == "convbw"


def test_a_neighbours_choice_that_does_not_apply_falls_through_to_the_heuristic():
    odd = TUNED.with_(batch=12)  # k_batch 32 cannot split 12 images
    sel = select(odd, "sm_80", dbs=[_db()])
    assert sel.path == "heuristic"


def test_select_takes_under_a_millisecond():
    dbs = [_db()]
    select(NEAR, "sm_80", dbs=dbs)
    t0 = time.perf_counter()
    for _ in range(200):
        select(NEAR, "sm_80", dbs=dbs)
    assert (time.perf_counter() - t0) / 200 < 1e-3


def test_compile_op_goes_through_select_and_a_users_database(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    p = ConvBwdWeightProblem.from_ck("2 1 4 8 8 3 3 8 8 1 1 1 1 1 1 1 1")
    assert compile_op(p, "host").selection.path == "heuristic"
    db = TuningDB("local-task", "host", __import__("convbw_mlir.dispatch.build").dispatch.build.iree_version())
    winner = next(v for v in candidates(p, "host") if v.options == (("k_batch", 2),))
    db.add(p, winner, median_s=1e-4)
    db.save(tmp_path / "tuning" / db_file_name("local-task", "host"))
    assert [d.device for d in databases("host")] == ["local-task"]
    op = compile_op(p, "host")
    assert op.selection.path == "exact" and op.plan == winner.plan and op.plan.k_batch == 2
    assert compile_op(p, "host", k_batch=1).selection is None  # options given: no selection


def test_the_shipped_h100_database_selects_the_measured_resnet50_winners():
    dbs = databases("sm_80", "NVIDIA H100 80GB HBM3")
    assert len(dbs) == 1 and len(dbs[0].entries) >= 20
    sel = select(TUNED, "sm_80")  # ResNet-50's 3x3 at N=256: the explicit kernel, 358 us vs codegen's best 799
    assert sel.path == "exact" and sel.variant.plan.strategy == "explicit" and "NVIDIA H100" in sel.why
    assert dbs[0].lookup(TUNED)["metric"] == "kernel_s"
    conv1 = ConvBwdWeightProblem.from_ck("2 1 256 64 3 7 7 230 230 2 2 1 1 0 0 0 0")
    assert select(conv1, "sm_80").variant.form == "iree_fusilli"
    assert select(conv1.with_(dtype="bf16", dw_dtype="bf16"), "sm_80").path == "heuristic"  # f16 only was tuned


def test_a_tuned_plan_known_to_be_unsafe_is_not_replayed():
    import dataclasses

    from convbw_mlir.plan import Tile, decide

    p = ConvBwdWeightProblem.from_ck("2 1 32 128 128 3 3 14 14 1 1 1 1 1 1 1 1")  # 784 a split of 8
    codegen = decide(p, "sm_80", strategy="codegen")
    padded = dataclasses.replace(codegen, tile=Tile(128, 64, 64, 2, 2, 2, "NV_MMA_SYNC_F32_16x8x16_F16"))
    db = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    db.add(p, Variant("convbw", padded), median_s=1e-4, why="stored before the split-step rule")
    with pytest.warns(UserWarning, match="read past x and dy"):
        sel = select(p, "sm_80", dbs=[db])
    assert sel.path != "exact" and sel.variant.plan == decide(p, "sm_80")  # decided anew


def _users(p: ConvBwdWeightProblem, iree: str | None = None) -> TuningDB:
    """A user's database for ``p`` on sm_80 whose winner is not the shipped one's: IREE's codegen of our tile."""
    from convbw_mlir.dispatch.build import iree_version
    from convbw_mlir.plan import decide

    db = TuningDB("my-gpu", "sm_80", iree or iree_version())
    db.add(p, Variant("convbw", decide(p, "sm_80", strategy="codegen"), (("strategy", "codegen"),)), median_s=1e-4)
    return db


def test_a_users_database_overlays_the_shipped_one_where_both_have_the_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path))
    shipped = select(TUNED, "sm_80")
    assert shipped.path == "exact" and "NVIDIA H100" in shipped.why
    _users(TUNED).save(tmp_path / "tuning" / db_file_name("my-gpu", "sm_80"))
    assert [d.device for d in databases("sm_80")] == ["my-gpu", "NVIDIA H100 80GB HBM3"]
    mine = select(TUNED, "sm_80")  # the shipped entry served it before (issue 42)
    assert mine.path == "exact" and mine.why.startswith("tuned on my-gpu") and mine.variant != shipped.variant


def test_select_db_file_overlays_the_others_and_is_refused_by_name_where_unusable(tmp_path, capsys, monkeypatch):
    from convbw_mlir.cli import main

    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    mine = _users(TUNED).save(tmp_path / "mine.json")
    assert main(["select", "--ck", TUNED.to_ck(), "--target", "sm_80", "--db", str(mine)]) == 0
    assert "path: exact (tuned on my-gpu" in capsys.readouterr().out  # not the shipped H100 entry
    # another target's or IREE version's file, asked for by name, was passed over silently
    for target, db, why in [
        ("gfx942", mine, f"{mine} is a database for target sm_80, not gfx942"),
        ("sm_80", _users(TUNED, "3.12.0").save(tmp_path / "old.json"), "old.json was measured with IREE 3.12.0, this "),
    ]:
        assert main(["select", "--ck", TUNED.to_ck(), "--target", target, "--db", str(db)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("convbw: error: --db: ") and why in err and err.count("\n") == 1, err
