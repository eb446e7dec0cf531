"""Epilogues (scale, bilinear, accumulate): the problem model, the op, the numerics on the CPU for
every strategy shape (unsplit, chunked split-K, rows split, explicit GEMM, transposing layouts) and
type, CK's exact bilinear case, gradient accumulation in the caller's buffer, and bad input."""

import math
import re

import numpy as np
import pytest
from conftest import suite

from convbw_mlir.epilogues import check_epilogue_arrays, integer_inputs, random_d
from convbw_mlir.problem import ConvBwdWeightProblem, Epilogue
from convbw_mlir.reference import assert_close, random_inputs, reference, sample_indices, sample_reference

CONV = ConvBwdWeightProblem.from_ck("2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1")
SHAPES = {
    "3x3_g2": CONV,
    "3x3_gkcyx": CONV.with_(layout=0),  # dW transposed from the accumulator: the epilogue transposes too
    "1x1_gemm": ConvBwdWeightProblem.from_ck("2 1 4 8 16 1 1 6 6 1 1 1 1 0 0 0 0"),
    "1x1_strided": ConvBwdWeightProblem.from_ck("2 1 4 8 16 1 1 7 7 2 2 1 1 0 0 0 0"),
    "depthwise": ConvBwdWeightProblem.from_ck("2 8 2 1 1 3 3 8 8 1 1 1 1 1 1 1 1"),
    "1d_torch": ConvBwdWeightProblem.from_ck("1 1 3 6 5 3 9 2 1 1 1", layout="torch"),
}
EPILOGUES = {
    "scale": Epilogue("scale", 0.25),
    "bilinear": Epilogue("bilinear", 2.0, -0.5),
    "bilinear_f32d": Epilogue("bilinear", 1.5, 3.0, "f32"),
    "accumulate": Epilogue("accumulate"),
}
SPLITS = {"unsplit": {"k_batch": 1}, "split2": {"k_batch": 2}, "rows": {"k_batch": "rows"}}


def run(compiled, p: ConvBwdWeightProblem, seed: int = 1, **options) -> tuple[np.ndarray, np.ndarray]:
    """Run p's op on random data; returns (result, float64 reference)."""
    op = compiled(p, "host", **options)
    x, dy = random_inputs(p, seed=seed)
    d = random_d(p, seed=seed + 1)
    if p.epilogue is not None and p.epilogue.kind == "accumulate":
        out = d.copy()
        got = op.run(x, dy, out=out)
        assert got is out  # the result lands in the caller's buffer
    else:
        got = op.run(x, dy, d)
    return got, reference(p, x, dy, d)


# -- the problem model ------------------------------------------------------------------------------
def test_epilogue_is_part_of_the_problem_identity_and_round_trips():
    plain = CONV
    for ep in EPILOGUES.values():
        p = plain.with_(epilogue=ep)
        assert p != plain and hash(p) != hash(plain) and p.name != plain.name
        assert ConvBwdWeightProblem.from_dict(p.to_dict()) == p
        assert p.plain == plain
    assert "epilogue" not in plain.to_dict()  # plain problems' dicts (and cache keys) are as before
    assert plain.with_(epilogue={"kind": "bilinear", "alpha": 2, "beta": 2}).epilogue == Epilogue(
        "bilinear", 2.0, 2.0, "f16"
    )


def test_d_type_defaults_to_dw_type_and_min_bytes_counts_d():
    p = CONV.with_(dw_dtype="f32", epilogue=Epilogue("bilinear", 2, 2))
    assert p.epilogue.d_dtype == "f32"
    assert p.min_bytes == p.plain.min_bytes + math.prod(p.dw_shape) * 4


@pytest.mark.parametrize(
    "epilogue, message",
    [
        (dict(kind="relu"), "epilogue.kind: unknown epilogue 'relu'"),
        (dict(kind="bilinear", alpha=float("nan")), "epilogue.alpha: must be finite, got nan"),
        (dict(kind="bilinear", beta=float("-inf")), "epilogue.beta: must be finite, got -inf"),
        (dict(kind="bilinear", alpha="2"), "epilogue.alpha: expected a real number, got '2'"),
        (dict(kind="scale", alpha=2, beta=1), "epilogue.beta: a scale epilogue has no D term"),
        (dict(kind="accumulate", d_dtype="f32"), "accumulate takes D of the output's own type (f16), got f32"),
        (dict(kind="bilinear", d_dtype="bf16"), "bilinear takes D of dW's type or f32 (f16 or f32), got bf16"),
        (dict(kind="bilinear", gamma=1), "epilogue: unknown field(s) ['gamma']"),
        (dict(kind="scale", alpha=1e39), "epilogue.alpha: 1e+39 is beyond f32's range (largest 3.40282e+38)"),
        (dict(kind="scale", alpha=7e4), "epilogue.alpha: 70000.0 is beyond the range of dW's type f16 (largest 65504)"),
        (dict(kind="bilinear", beta=-1e5), "epilogue.beta: -100000.0 is beyond the range of dW's type f16"),
    ],
)
def test_bad_epilogues_name_the_field_and_value(epilogue, message):
    with pytest.raises(
        (ValueError, TypeError),
        match=re.escape(message),
    ):
        CONV.with_(epilogue=epilogue)


@pytest.mark.parametrize("kind", list(EPILOGUES))
def test_op_prints_parses_and_reads_back_the_epilogue(kind):
    from convbw_mlir.dialects import convbw

    from convbw_mlir.ir_imports import ir, new_context

    p = CONV.with_(layout=0, dw_dtype="f32", epilogue=EPILOGUES[kind])
    with new_context():
        text = str(convbw.build_module(p))
        module = ir.Module.parse(text)
        op = next(o for o in module.body.operations[0].regions[0].blocks[0].operations if convbw.is_conv_bwd_weight(o))
        assert convbw.problem_of(op) == p
    assert ("iree.abi.output = 0 : index" in text) == (kind == "accumulate")


# -- numerics on the CPU ----------------------------------------------------------------------------
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("kind", list(EPILOGUES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_epilogue_matches_reference(compiled, shape, kind, split):
    p = SHAPES[shape].with_(epilogue=EPILOGUES[kind])
    got, want = run(compiled, p, **SPLITS[split])
    assert_close(p, got, want)


@pytest.mark.parametrize("types", [("bf16", "bf16"), ("f32", "f32"), ("bf16", "f32"), ("f16", "f32")])
@pytest.mark.parametrize("kind", ["bilinear_f32d", "accumulate"])
def test_epilogue_matches_reference_for_each_type(compiled, types, kind):
    p = CONV.with_(dtype=types[0], dw_dtype=types[1], epilogue=EPILOGUES[kind])
    got, want = run(compiled, p, k_batch=2)
    assert_close(p, got, want)


@pytest.mark.parametrize("split", ["unsplit", "split2"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_ck_bilinear_case_is_exact_in_f32(compiled, dtype, split):
    # CK's bilinear test: alpha = beta = 2, integer-valued inputs in [-5, 5]; |sums| << 2**24: exact
    p = CONV.with_(dtype=dtype, dw_dtype="f32", epilogue=Epilogue("bilinear", 2.0, 2.0, "f32"))
    x, dy, d = integer_inputs(p, seed=3)
    got = compiled(p, "host", **SPLITS[split]).run(x, dy, d)
    np.testing.assert_array_equal(got, reference(p, x, dy, d))


def test_accumulate_over_micro_batches_sums_in_the_callers_buffer(compiled):
    p = CONV.with_(dtype="f32", dw_dtype="f32", epilogue=Epilogue("accumulate"))
    op = compiled(p, "host")
    grad = np.zeros(p.dw_shape, np.float32)
    want = np.zeros(p.dw_shape)
    for step in range(3):
        x, dy = random_inputs(p, seed=10 + step)
        assert op.run(x, dy, out=grad) is grad
        want += reference(p.plain, x, dy)
    assert_close(p, grad, want)


def test_sample_reference_applies_the_epilogue():
    p = CONV.with_(epilogue=Epilogue("bilinear", 2.0, -3.0))
    x, dy = random_inputs(p)
    d = random_d(p)
    idx = sample_indices(p, 16)
    np.testing.assert_allclose(sample_reference(p, x, dy, idx, d), reference(p, x, dy, d)[tuple(idx.T)])


# -- bad input: one clear error, the caller's arrays untouched ---------------------------------------
BILINEAR = CONV.with_(epilogue=Epilogue("bilinear", 2.0, 2.0, "f32"))
ACCUMULATE = CONV.with_(epilogue=Epilogue("accumulate"))


class _DeviceTensor:
    """Stands in for a tensor on a GPU (torch's has .device)."""

    device = "cuda:0"
    shape = CONV.dw_shape


@pytest.mark.parametrize(
    "problem, d, out, error, message",
    [
        (BILINEAR, None, None, ValueError, "d: this op was compiled with a bilinear epilogue"),
        (
            BILINEAR,
            np.zeros((2, 8, 3, 3, 15), np.float32),
            None,
            ValueError,
            r"d: expected shape \(2, 8, 3, 3, 16\) \(dW's layout G/K/Y/X/C\)",
        ),
        (BILINEAR, np.zeros((2, 16, 3, 3, 8), np.float32), None, ValueError, "d: expected shape"),  # another layout
        (
            BILINEAR,
            np.zeros(CONV.dw_shape, np.float16),
            None,
            TypeError,
            r"d: expected dtype float32 \(f32\), got float16",
        ),
        (
            BILINEAR,
            _DeviceTensor(),
            None,
            TypeError,
            "d: expected a host numpy array, got .*_DeviceTensor on device cuda:0",
        ),
        (
            BILINEAR,
            np.zeros(CONV.dw_shape, np.float32),
            np.zeros(CONV.dw_shape, np.float32),
            TypeError,
            "out: expected dtype float16",
        ),
        (ACCUMULATE, None, None, ValueError, "out: this op was compiled with an accumulate epilogue"),
        (ACCUMULATE, None, np.zeros(CONV.dw_shape, np.float32), TypeError, "out: expected dtype float16"),
        (ACCUMULATE, None, np.zeros((2, 8, 3, 3), np.float16), ValueError, "out: expected shape"),
        (
            ACCUMULATE,
            np.zeros(CONV.dw_shape, np.float16),
            np.zeros(CONV.dw_shape, np.float16),
            ValueError,
            "d: an accumulate epilogue reads D from out=",
        ),
        (CONV, np.zeros(CONV.dw_shape, np.float16), None, ValueError, "d: this op was compiled without an epilogue"),
        (
            CONV.with_(epilogue=Epilogue("scale", 2.0)),
            np.zeros(CONV.dw_shape, np.float16),
            None,
            ValueError,
            "compiled with a scale epilogue",
        ),
    ],
)
def test_bad_d_or_out_is_refused_before_running(compiled, problem, d, out, error, message):
    op = compiled(problem, "host")
    x, dy = random_inputs(problem)
    before = [a.copy() for a in (d, out) if isinstance(a, np.ndarray)]
    with pytest.raises(error, match=message):
        op.run(x, dy, d, out=out)
    after = [a for a in (d, out) if isinstance(a, np.ndarray)]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_read_only_out_is_refused():
    out = np.zeros(CONV.dw_shape, np.float16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        check_epilogue_arrays(ACCUMULATE, None, out)


def test_plain_op_writes_into_out(compiled):
    op = compiled(CONV, "host")
    x, dy = random_inputs(CONV)
    out = np.full(CONV.dw_shape, 7, np.float16)
    assert op.run(x, dy, out=out) is out
    assert_close(CONV, out, reference(CONV, x, dy))


def test_saved_artifact_keeps_its_epilogue(compiled, tmp_path):
    from convbw_mlir.build.artifact import CompiledOp

    op = compiled(BILINEAR, "host")
    op.save(tmp_path / "art")
    loaded = CompiledOp.load(tmp_path / "art")
    assert loaded.problem == BILINEAR
    x, dy = random_inputs(BILINEAR)
    d = random_d(BILINEAR)
    np.testing.assert_array_equal(loaded.run(x, dy, d), op.run(x, dy, d))


# -- the plan, the CLIs, the benchmark's kernels ----------------------------------------------------
@pytest.mark.parametrize("target", ["host", "sm_80", "gfx942"])
def test_epilogue_changes_no_plan(target):
    from convbw_mlir.plan import decide

    for p in SHAPES.values():
        for ep in EPILOGUES.values():
            with_ep, plain = decide(p.with_(epilogue=ep), target), decide(p, target)
            if plain.depthwise is not None or plain.gemv is not None:  # no epilogue in these kernels: codegen's plan
                assert with_ep == decide(p, target, strategy="codegen")
                continue
            # the explicit sm_80 kernel applies it in its store (tests/test_explicit_epilogue.py): same plan
            assert with_ep == plain


def test_cli_run_verifies_each_epilogue(capsys):
    from convbw_mlir.cli import main

    ck = "2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1"
    # --scale 1e-8: an f16 dW of subnormals and zeros, correctly rounded (issue 42: the verifier failed it)
    for flags in (["--scale", "0.5"], ["--scale", "1e-8"], ["--alpha", "2", "--beta", "2", "--d-type", "f32"],
                  ["--accumulate"]):  # fmt: skip
        assert main(["run", "--ck", ck, "--reps", "1", *flags]) == 0
        out = capsys.readouterr().out
        assert "epilogue: " in out and "PASS" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--scale", "nan"], "argument --scale: must be finite, got 'nan'"),
        (["--alpha", "inf"], "argument --alpha: must be finite, got 'inf'"),
        (["--scale", "2", "--beta", "1"], "--scale: does not combine with --beta"),
        (["--accumulate", "--d-type", "f32"], "--d-type: accumulate reads D from the output itself"),
        (["--d-type", "f32"], "--d-type: applies to a bilinear epilogue"),
        (["--alpha", "2", "--d-type", "bf16"], "epilogue.d_dtype: bilinear takes D of dW's type or f32"),
    ],
)
def test_cli_bad_epilogue_flags_are_one_line_errors(capsys, flags, message):
    from convbw_mlir.cli import main

    assert main(["compile", "--ck", "2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1", *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_convbw_opt_problem_input_carries_the_epilogue(capsys):
    from convbw_mlir.opt import main

    assert main(["--ck", "2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1", "--alpha", "2", "--beta", "2"]) == 0
    out = capsys.readouterr().out
    assert 'epilogue = {alpha = 2.000000e+00 : f64, beta = 2.000000e+00 : f64, kind = "bilinear"}' in out


def test_benchmark_kernels_are_correct_and_the_unfused_one_has_its_own_dispatch(tmp_path):
    import tempfile
    from pathlib import Path

    from conftest import bench_script

    epilogue = bench_script("epilogue")
    KINDS, _child, compile_problem, unfused_text = (epilogue.KINDS, epilogue._child, epilogue.compile_problem,
                                                    epilogue.unfused_text)  # fmt: skip

    from convbw_mlir.build.iree import compile_module

    p = CONV
    entry = {"kernels": compile_problem(p, "host", tmp_path, "conv")}
    for kind in KINDS:
        assert entry["kernels"][kind]["ok"], entry["kernels"][kind]
        assert _child(tmp_path, entry, kind, "local-task")["status"] == "ok", kind
    counts = []
    for text in (unfused_text(p, "sm_80"), None):
        from convbw_mlir.build.compile import lowered_text
        from convbw_mlir.pipelines import for_target

        fused = p.with_(epilogue=Epilogue("bilinear", 2, 2))  # on codegen's plan, as the unfused one
        text = text or lowered_text(fused, for_target("sm_80", strategy="codegen"))
        with tempfile.TemporaryDirectory() as d:
            compile_module(text, "sm_80", [f"--iree-hal-dump-executable-sources-to={d}"])
            counts.append(len(list(Path(d).glob("*.mlir"))))
    assert counts[0] == counts[1] + 1  # the unfused epilogue is one more kernel, the fused one none


CK_TESTS = suite("ck_test_grouped_convnd_bwd_weight")


@pytest.mark.parametrize("args", [a for _, a in CK_TESTS], ids=[n for n, _ in CK_TESTS])
def test_ck_test_problems_with_bilinear_epilogue_match_reference(compiled, args):
    # CK's own list with CK's bilinear values; the plan picks each problem's strategy and split
    p = ConvBwdWeightProblem.from_ck(args).with_(epilogue=Epilogue("bilinear", 2.0, 2.0))
    got, want = run(compiled, p)
    assert_close(p, got, want)
