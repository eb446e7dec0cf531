"""Random problems, compiled for the host and run, match a direct float64 sum; impossible ones are refused.

Hypothesis draws problems over rank 1-3, G, N, C, K, sizes, filters, strides, dilations, asymmetric
pads, every layout family and type pairing, the fused epilogues (scale, bilinear with D of dW's type or f32,
accumulate into the caller's buffer), and compile options (k_batch 1/2/3/7/rows/auto, plan_for
every target); about one example in six is made invalid and must be refused with a ValueError/TypeError
naming the field, before IREE is called. Each valid problem compiles and runs in a long-lived worker
process (``fuzz_support.IsolatedRunner``: one child for many examples, cheaper than a child per compile as
``compile_op(..., isolate=True)`` makes, and it also survives a crash while running), so an IREE crash is
counted, not fatal. Failures are collected over the whole run (not shrunk) and the test fails on any that
is not in :data:`fuzz_support.KNOWN_FAILURES` (none open now; the fixed ones are reproducers that must pass).

CONVBW_FUZZ_EXAMPLES sets the number of examples (default 200; ``make fuzz`` runs 2000); the seed is
fixed (``derandomize``), so a run repeats exactly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fuzz_support import (
    FIXED_FAILURES,
    Case,
    FuzzStats,
    IsolatedRunner,
    cases,
    check_case,
    make_inputs,
    max_error,
    oracle_dw,
    tolerance,
)
from hypothesis import HealthCheck, Phase, given, settings

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem

EXAMPLES = int(os.environ.get("CONVBW_FUZZ_EXAMPLES", "200"))
PROGRESS_EVERY = 100 if EXAMPLES > 200 else 0  # a line per 100 examples in long runs; CI stays quiet


@pytest.fixture(scope="module")
def runner():
    r = IsolatedRunner()
    yield r
    r.close()


def test_fuzz_random_problems_match_direct_sum_or_are_refused(runner, capsys):
    stats = FuzzStats()

    # Collect every outcome instead of failing at the first: one run reports every failing problem.
    # No shrinking, as nothing is raised inside; the database stays off so CI draws the same examples.
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(case=cases())
    def fuzz(case: Case) -> None:
        check_case(case, runner, stats)
        if PROGRESS_EVERY and stats.counts["examples"] % PROGRESS_EVERY == 0:
            with capsys.disabled():
                print(stats.progress(), flush=True)

    fuzz()
    with capsys.disabled():
        print("\n" + stats.summary())
    assert stats.counts["valid"] and stats.counts["invalid"], "the strategies must draw both kinds"
    assert not stats.failures, stats.summary()


# -- the pieces the fuzz test relies on ----------------------------------------------------------------
def test_oracle_matches_hand_computed_1d_stride2_pad1():
    # x = [1, 2, 3] padded to [0, 1, 2, 3, 0], filter 2, stride 2: outputs read (0,1) and (2,3).
    p = ConvBwdWeightProblem(1, 1, 1, 1, (3,), (2,), stride=2, pad_low=1, pad_high=1, dtype="f32")
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32).reshape(p.x_shape)
    dy = np.array([10.0, 100.0], dtype=np.float32).reshape(p.dy_shape)
    # dW[0] = 0*10 + 2*100, dW[1] = 1*10 + 3*100
    np.testing.assert_array_equal(oracle_dw(p, x, dy).reshape(-1), [200.0, 310.0])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_oracle_agrees_with_product_reference_in_every_layout(layout):
    from convbw_mlir.reference import reference

    groups = 2 if LAYOUTS[layout].grouped else 1
    p = ConvBwdWeightProblem(groups, 2, 3, 2, (5, 4), (3, 2), stride=(2, 1), dilation=(1, 2),
                             pad_low=(1, 0), pad_high=(0, 2), dtype="f32", layout=layout)  # fmt: skip
    x, dy = make_inputs(p)
    np.testing.assert_allclose(oracle_dw(p, x, dy), reference(p, x, dy), rtol=1e-12, atol=1e-12)


def test_max_error_flags_a_wrong_entry_above_tolerance():
    p = ConvBwdWeightProblem(1, 2, 2, 2, (4,), (3,), dtype="f32")
    x, dy = make_inputs(p)
    want = oracle_dw(p, x, dy)
    wrong = want.copy()
    wrong[0, 0, 0] += 1e-3 * np.sqrt(np.mean(want**2))
    assert max_error(want.astype(np.float32), want) <= tolerance(p) < max_error(wrong, want)


def test_runner_records_a_segfault_and_keeps_going(runner):
    answer = runner.call("crash")
    assert answer["status"] == "crashed" and answer["exitcode"] != 0
    p = ConvBwdWeightProblem(1, 1, 1, 1, (3,), (2,), dtype="f32")
    x, dy = make_inputs(p)
    after = runner.call("run", p, {}, x, dy)
    assert after["status"] == "ok" and max_error(after["dw"], oracle_dw(p, x, dy)) <= tolerance(p)


@pytest.mark.parametrize("known", FIXED_FAILURES, ids=[k.name for k in FIXED_FAILURES])
def test_fixed_failure_reproducer_compiles_and_matches(runner, known):
    p = known.problem
    x, dy = make_inputs(p)
    answer = runner.call("run", p, dict(known.options), x, dy, known.compiles, fresh=True)
    assert answer["status"] == "ok", answer.get("message", answer)
    assert max_error(answer["dw"], oracle_dw(p, x, dy)) <= tolerance(p)


class _FakeRunner:
    """Answers every request with one canned reply (the bookkeeping tests need no compiler)."""

    starts = 0

    def __init__(self, answer):
        self.answer = answer

    def call(self, *request, fresh=False):
        return self.answer


def _case(**changes) -> Case:
    fields = dict(groups=1, batch=2, in_channels=1, out_channels=1, input_size=(4, 8), filter_size=(3, 3),
                  stride=(2, 1), dtype="f16", layout="NHWGC/GKYXC/NHWGK")  # fmt: skip
    fields.update(changes)
    return Case(tuple(fields.items()), ())


def test_new_compile_error_is_a_failure_but_the_known_one_is_not(monkeypatch):
    import fuzz_support

    known = FIXED_FAILURES[0]  # as if it were still open
    monkeypatch.setattr(fuzz_support, "KNOWN_FAILURES", (known,))
    stats = FuzzStats()
    answer = {"status": "error", "type": "CompileError", "message": f"error: 'linalg.generic' op {known.message}"}
    check_case(_case(), _FakeRunner(answer), stats)  # output height 1, filter 3, stride 2: the known one
    assert stats.counts["known"] == 1 and not stats.failures
    check_case(_case(stride=(1, 1), input_size=(3, 8)), _FakeRunner(answer), stats)  # same text, other problem
    check_case(_case(batch=3), _FakeRunner({**answer, "message": "error: something else"}), stats)
    assert stats.counts["error"] == 2 and len(stats.failures["error"]) == 2


def test_wrong_result_crash_and_silent_acceptance_are_failures():
    case = _case()
    p = ConvBwdWeightProblem(**case.kwargs)
    x, dy = make_inputs(p)
    stats = FuzzStats()
    wrong = (oracle_dw(p, x, dy) + 1.0).astype(np.float16)
    check_case(case, _FakeRunner({"status": "ok", "dw": wrong, "compile_s": 0.0, "run_s": 0.0}), stats)
    check_case(_case(batch=4), _FakeRunner({"status": "crashed", "exitcode": -11}), stats)
    bad_option = Case(case.fields, (("k_batch", 0),), ("k_batch", "k-batch"), "k_batch")
    check_case(bad_option, _FakeRunner({"status": "accepted"}), stats)
    assert set(stats.failures) == {"wrong", "crashed", "accepted"}
