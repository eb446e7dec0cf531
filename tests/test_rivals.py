"""IREE's own forms (the bench's and the tuner's rivals: direct, torch, fusilli) are right wherever ours is.

The rival fuzz draws small valid problems (tests/fuzz_support.py's strategies, two in three narrowed to the
torch form's 2-D, G = 1, strides pushed up to and past the padded input now and then: a single output row,
where the torch form's role swap broke), compiles each IREE form for the host as the tuner does
(``compile_variant``), runs it and compares it with the float64 direct sum. Every outcome is collected and
the test fails on any problem that does not compile or does not match (but for fusilli's flags where only
the host's backend fails and sm_80 compiles it: docs/decisions.md#fusilli-flags). CONVBW_RIVAL_EXAMPLES
sets the number of problems (default 20 besides the explicit examples, about three compiles each); the
seed is fixed (``derandomize``).
"""

from __future__ import annotations

import os

import pytest
from fuzz_support import (
    IsolatedRunner,
    make_d,
    make_inputs,
    max_error,
    oracle_dw,
    oracle_epilogue,
    tolerance,
    valid_fields,
)
from fuzz_support import repro as describe
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from convbw_mlir.build.contenders import FUSILLI_FLAGS, build_contender
from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue

EXAMPLES = int(os.environ.get("CONVBW_RIVAL_EXAMPLES", "20"))
# fusilli's GPU flags on llvm-cpu: IREE fails on some; they must compile for sm_80 (docs/decisions.md#fusilli-flags)
FUSILLI_HOST_ERROR = (
    'failed to run translation of source executable to target executable for backend #hal.executable.target<"llvm-cpu"'
)
FORMS = ("iree_direct", "iree_torch", "iree_fusilli")
# The problem (issue 30): stride 224 = input 224, filter 2, so one output row and column.
STRIDE_IS_INPUT = "2 1 128 4 192 2 2 224 224 224 224 1 1 0 0 0 0"


@pytest.fixture(scope="module")
def runner():
    r = IsolatedRunner()
    yield r
    r.close()


def forms_of(problem: ConvBwdWeightProblem) -> tuple[str, ...]:
    """The IREE forms ``problem`` has: the torch form only for 2-D, G = 1, no epilogue."""
    torch_form = problem.rank == 2 and problem.groups == 1 and problem.epilogue is None
    return tuple(f for f in FORMS if f != "iree_torch" or torch_form)


@pytest.mark.parametrize("target", ["host", "sm_80"])
@pytest.mark.parametrize("form", FORMS)
def test_every_iree_form_compiles_where_the_stride_equals_the_input_size(form, target):
    from convbw_mlir.build.iree import compile_module

    problem = ConvBwdWeightProblem.from_ck(STRIDE_IS_INPUT).with_(dtype="f16", dw_dtype="f16")
    assert problem.output_size == (1, 1)
    text, flags = build_contender(problem, form, target)
    assert ("linalg.conv_2d_nhwc_hwcf" in text) == (form != "iree_direct")
    assert flags == (FUSILLI_FLAGS if form == "iree_fusilli" else [])
    assert compile_module(text, target, flags)[:4]  # a vmfb (IREE raised CompileError before the fix)


def test_the_torch_form_of_a_problem_with_an_epilogue_is_none_and_fusilli_takes_the_direct_form():
    problem = ConvBwdWeightProblem(1, 2, 3, 4, (5, 5), (3, 3), dtype="f32", epilogue=Epilogue("scale", 0.5))
    assert build_contender(problem, "iree_torch", "host") == (None, [])
    fusilli, flags = build_contender(problem, "iree_fusilli", "host")
    assert "linalg.conv_2d_nhwc_hwcf" not in fusilli and flags == FUSILLI_FLAGS


@st.composite
def rival_problems(draw: st.DrawFn) -> ConvBwdWeightProblem:
    """Small valid problems, two in three of the torch form's kind, some strides at or past the input."""
    fields = draw(valid_fields(rank=2, one_group=True) if draw(st.integers(0, 2)) else valid_fields())
    stride = list(fields["stride"])
    for i, size in enumerate(fields["input_size"]):
        if draw(st.integers(0, 2)) == 0:  # any stride is valid: the output shrinks to one position
            padded = size + fields["pad_low"][i] + fields["pad_high"][i]
            stride[i] = max(1, padded + draw(st.integers(-1, 2)))
    return ConvBwdWeightProblem(**(fields | {"stride": tuple(stride)}))


def _host_only(form: str, answer: dict, problem: ConvBwdWeightProblem, runner: IsolatedRunner) -> bool:
    """Whether ``answer`` is IREE's llvm-cpu backend refusing what fusilli's GPU flag set formed, for a
    kernel that compiles for sm_80 (the target those flags are for)."""
    if form != "iree_fusilli" or FUSILLI_HOST_ERROR not in answer.get("message", ""):
        return False
    return runner.call("compile", problem, form, "sm_80")["status"] == "ok"


def _check(problem: ConvBwdWeightProblem, runner: IsolatedRunner, failures: list[str], counts: dict) -> None:
    """Compile and run every IREE form of ``problem``, counting kernels and appending failures."""
    x, dy = make_inputs(problem)
    d = make_d(problem)
    want = oracle_epilogue(problem, oracle_dw(problem, x, dy), d)
    for form in forms_of(problem):
        counts["kernels"] += 1
        answer = runner.call("variant", problem, form, x, dy, d)
        where = f"{form} {describe(problem, {})}"
        if answer["status"] != "ok" and _host_only(form, answer, problem, runner):
            counts["host_only"] += 1
        elif answer["status"] != "ok":
            message = answer.get("message", f"exit code {answer.get('exitcode')}")
            lines = [ln.strip() for ln in message.splitlines() if "error" in ln] or [message]
            failures.append(f"{where}: {answer['status']}: {lines[0][:300]}")
        elif (err := max_error(answer["dw"], want)) > tolerance(problem):
            failures.append(f"{where}: max error {err:.3g} > tolerance {tolerance(problem):.3g}")


def test_iree_forms_of_random_problems_compile_and_match_float64(runner, capsys):
    failures: list[str] = []
    counts = {"problems": 0, "kernels": 0, "host_only": 0}

    # Every outcome collected (no shrinking): one run names every failing problem.
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(problem=rival_problems())
    # the problem in small: one output row and column, stride = input, in f16
    @example(problem=ConvBwdWeightProblem.from_ck("2 1 2 3 2 2 2 5 5 5 5 1 1 0 0 0 0").with_(dtype="f16"))
    # every read row padding: stride past the input, the single output row inside the low pad
    @example(problem=ConvBwdWeightProblem(1, 1, 2, 2, (1, 4), (1, 2), stride=(4, 1), pad_low=(2, 0), dtype="f32"))
    # fusilli's flags, which the host's backend cannot translate here (sm_80 compiles it)
    @example(
        problem=ConvBwdWeightProblem.from_ck("2 1 4 1 3 3 3 7 7 1 3 1 1 2 1 1 2").with_(layout="NGCHW/GKYXC/NGKHW")
    )
    def fuzz(problem: ConvBwdWeightProblem) -> None:
        counts["problems"] += 1
        _check(problem, runner, failures, counts)

    fuzz()
    with capsys.disabled():
        print(
            f"\nrival fuzz: {counts['problems']} problems, {counts['kernels']} kernels, {len(failures)} failed, "
            f"{counts['host_only']} fusilli kernels the host cannot translate (compiled for sm_80)"
        )
    assert counts["problems"] >= EXAMPLES and not failures, "\n".join(failures)


def test_the_torch_form_keeps_torch_mlir_s_padding_where_there_is_more_than_one_output_row():
    p = ConvBwdWeightProblem(1, 2, 3, 4, (10, 10), (3, 3), stride=2, pad_low=1, pad_high=1, dtype="f32")
    assert p.output_size == (5, 5)  # reads 11 of the 12 padded rows
    text, _ = build_contender(p, "iree_torch", "host")
    assert "tensor<2x12x12x3xf32>" in text and "extract_slice" not in text
