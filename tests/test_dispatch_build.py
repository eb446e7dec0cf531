"""Parallel, crash-isolated builds: a variant that really crashes IREE costs only itself."""

from __future__ import annotations

import pytest

from convbw_mlir.dispatch import KernelCache, Registry, Variant, row_chunk_variant
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.reference import assert_close, random_inputs, reference

ONE_IMAGE = ConvBwdWeightProblem.from_ck("2 1 1 8 8 3 3 16 16 1 1 1 1 1 1 1 1")


def test_parallel_build_records_an_iree_segfault_and_builds_the_other_variants(tmp_path):
    reg = Registry("host", KernelCache(tmp_path / "cache"))
    crash = row_chunk_variant(ONE_IMAGE, "host", 4)  # IREE 3.13 segfaults on output-row chunks
    two = ONE_IMAGE.with_(batch=2)
    good = [Variant("convbw", decide(ONE_IMAGE, "host")), Variant("convbw", decide(two, "host", k_batch=2))]
    reg.declare(ONE_IMAGE, good[0])
    reg.declare(ONE_IMAGE, crash)
    reg.declare(two, good[1])
    report = reg.build(max_workers=2, progress=False)
    by = {r.variant: r for r in report.results}
    assert not by[crash].ok and "SIGSEGV" in by[crash].error
    for problem, v in ((ONE_IMAGE, good[0]), (two, good[1])):
        r = by[v]
        assert r.ok, r.error
        x, dy = random_inputs(problem)
        assert_close(problem, r.op.run(x, dy), reference(problem, x, dy))
    table = report.table()
    assert "| 3 | 2 | 0 | 1 | local | 2 |" in table and "SIGSEGV" in table
    again = reg.build(max_workers=2, progress=False)  # the good ones now come from the cache
    assert sum(r.hit for r in again.results) == 2


def test_a_build_past_its_timeout_is_recorded_as_hung(tmp_path):
    reg = Registry("host", KernelCache(tmp_path / "cache"))
    reg.declare(ONE_IMAGE, Variant("convbw", decide(ONE_IMAGE, "host")))
    (r,) = reg.build(max_workers=1, timeout=0.05, progress=False).results
    assert not r.ok and "timed out" in r.error


def test_bad_worker_count_is_one_error():
    with pytest.raises(ValueError, match="max_workers"):
        Registry("host").build(max_workers=0)
