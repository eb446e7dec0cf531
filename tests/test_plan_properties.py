"""Every plan's workspace and determinism (``plan.workspace_bytes``, ``plan.deterministic``), checked against
the buffers IREE allocates; ``compile_op(deterministic=..., max_workspace_bytes=...)``, select, the CLI and
the torch entry restricted by them."""

from __future__ import annotations

import pytest

from convbw_mlir import compile_op
from convbw_mlir.build.compile import run_pipeline
from convbw_mlir.build.iree import device_allocations
from convbw_mlir.dispatch import TuningDB, Variant, candidates, select
from convbw_mlir.plan import Plan, decide, plan_properties
from convbw_mlir.problem import ConvBwdWeightProblem

P = ConvBwdWeightProblem.from_ck
CONV = P("2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1")  # padded 3x3: IREE's codegen pads a copy of x
CONV4 = CONV.with_(layout=4)  # StreamK's layout
DEPTHWISE = P("2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1")
STRIDED_1X1 = P("2 1 64 256 64 1 1 28 28 2 2 1 1 0 0 0 0")
TINY = P("2 1 4 8 8 3 3 6 6 1 1 1 1 1 1 1 1")

# (target, problem, options): every strategy, split kind, StreamK size and GEMM form
PLANS = [
    ("host", TINY, {}),
    ("host", TINY, {"k_batch": 2}),
    ("host", P("2 1 4 8 16 1 1 6 6 2 2 1 1 0 0 0 0"), {}),
    ("sm_80", CONV, {}),  # explicit, split-K
    ("sm_80", CONV, {"k_batch": 4, "strategy": "codegen"}),  # mma, batch split, padded x
    ("sm_80", CONV4, {"strategy": "explicit", "streamk": 16}),  # StreamK, workspace hoisted as a constant too
    ("sm_80", CONV4, {"strategy": "explicit", "streamk": 33, "streamk_fixup": "tree"}),  # past the hoisting limit
    ("sm_80", CONV, {"strategy": "explicit", "producers": 2}),  # wave specialization
    ("sm_80", CONV4, {}),  # layout 4 in layout 2: x, dy transposed (split: stage 2 writes dW transposed)
    ("sm_80", CONV4, {"strategy": "explicit", "k_batch": 1, "layout4": "relayout"}),  # unsplit: dW before its transpose
    ("sm_80", CONV4, {"strategy": "explicit", "k_batch": 3, "layout4": "relayout"}),  # split-K: partials too
    ("sm_80", DEPTHWISE, {}),  # simt, batch split
    ("sm_80", DEPTHWISE.with_(layout=4), {"strategy": "explicit", "layout4": "relayout"}),  # the depthwise kernel
    ("sm_80", DEPTHWISE, {"k_batch": "rows"}),  # simt, rows split
    ("sm_80", P("1 1 4 64 1 10 400 5 1 0 0"), {}),  # the GEMV kernel: chunk partials
    ("sm_80", P("1 1 1 1 32 3 32 1 1 1 1"), {}),  # the GEMV kernel, one chunk: dW written by the kernel, no workspace
    ("sm_80", STRIDED_1X1, {"strategy": "codegen"}),  # GEMM of a strided 1x1: x subsampled
    ("sm_80", STRIDED_1X1.with_(input_size=(14, 14), stride=1), {"strategy": "codegen", "reduction_innermost": True}),
    ("gfx942", CONV, {}),
    ("gfx942", CONV, {"strategy": "explicit", "k_batch": 2}),
    ("gfx1100", CONV, {}),
]


def _lowered(problem: ConvBwdWeightProblem, target: str, plan: Plan) -> bytes:
    from convbw_mlir.dialects import convbw

    from convbw_mlir.build.compile import _bytecode
    from convbw_mlir.ir_imports import new_context
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.targets import resolve

    with new_context() as ctx:
        module = convbw.build_module(problem, plan)
        run_pipeline(module, for_target(resolve(target)), ctx)
        return _bytecode(module)


@pytest.mark.parametrize(("target", "problem", "options"), PLANS, ids=lambda v: str(v)[:40])
def test_iree_allocates_what_the_plans_workspace_says_and_no_more(target, problem, options):
    plan = decide(problem, target, **options)
    got = device_allocations(_lowered(problem, target, plan), target)
    scratch = got.get("transient", 0) + got.get("constant", 0)  # "external": dW itself
    # at most the plan's word; at most IREE's 64-byte alignment of StreamK's two buffers, twice, above it
    assert scratch <= plan.workspace_bytes <= scratch + 256, (plan, got)
    assert plan.deterministic is True


def test_a_plans_properties_are_not_its_identity():
    plan = decide(CONV, "sm_80")
    bare = Plan.from_dict(plan.to_dict())  # as the IR attribute and a database hold it: no problem to size by
    assert bare.workspace_bytes is None and bare.deterministic is None
    assert bare == plan and hash(bare) == hash(plan) and bare.to_dict() == plan.to_dict()
    assert "workspace_bytes" not in plan.to_dict() and "workspace" not in repr(plan)
    assert plan_properties(CONV, bare).workspace_bytes == plan.workspace_bytes == 12 * 64 * 64 * 9 * 4


def test_compiled_saved_and_loaded_ops_report_their_plans_properties(tmp_path):
    from convbw_mlir.build.artifact import CompiledOp

    op = compile_op(TINY, "host", cache=False, k_batch=2)
    # two f32 partials of dW and the padded copy of x (4 images of 8x8x8 f16)
    assert op.plan.workspace_bytes == 2 * 8 * 9 * 8 * 4 + 4 * 8 * 8 * 8 * 2 and op.plan.deterministic
    op.save(tmp_path / "op")
    back = CompiledOp.load(tmp_path / "op")
    assert (back.plan.workspace_bytes, back.plan.deterministic) == (op.plan.workspace_bytes, True)


def test_max_workspace_bytes_makes_select_take_the_first_plan_within():
    heuristic = select(CONV, "sm_80", dbs=[])
    assert heuristic.variant.plan.workspace_bytes == 1_769_472  # 12 split-K partials of dW
    sel = select(CONV, "sm_80", dbs=[], max_workspace_bytes=1_000_000)
    assert sel.variant.plan.workspace_bytes <= 1_000_000 and sel.variant != heuristic.variant
    assert "the heuristic's plan needs 1769472 bytes of workspace" in sel.why
    assert select(CONV, "sm_80", dbs=[], max_workspace_bytes=0).variant.plan.workspace_bytes == 0  # explicit, unsplit


def test_an_unsatisfiable_workspace_limit_is_one_error_naming_it_and_the_least():
    # on the host every plan pads a copy of x (IREE's CPU codegen; no explicit kernel there)
    with pytest.raises(ValueError, match=r"^max_workspace_bytes: 100: every plan of .* on host needs more "
                                         r"\(the least: 576 bytes, convbw\[heuristic\]\)$"):  # fmt: skip
        select(P("2 1 1 8 8 3 3 4 4 1 1 1 1 1 1 1 1"), "host", dbs=[], max_workspace_bytes=100)


def test_a_tuned_winner_over_the_limit_or_not_deterministic_is_passed_over():
    grouped = P("2 32 32 8 8 3 3 28 28 1 1 1 1 1 1 1 1")
    db = TuningDB("NVIDIA H100 80GB HBM3", "sm_80", "3.13.0")
    db.add(grouped, Variant("iree_fusilli"), median_s=2e-4, why="fastest correct")  # IREE's split reduction
    winner = next(v for v in candidates(CONV, "sm_80") if v.options == (("k_batch", 4),))
    db.add(CONV, winner, median_s=1e-3, why="fastest correct")
    assert select(grouped, "sm_80", dbs=[db]).path == "exact"
    assert select(grouped, "sm_80", dbs=[db], deterministic=True).variant.form == "convbw"
    assert select(grouped, "sm_80", dbs=[db], max_workspace_bytes=10**9).variant.form == "convbw"  # unknown: out
    tuned = select(CONV, "sm_80", dbs=[db])
    assert tuned.path == "exact" and tuned.variant.plan.workspace_bytes > 1_000_000
    assert select(CONV, "sm_80", dbs=[db], max_workspace_bytes=1_000_000).variant.plan.workspace_bytes <= 1_000_000


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_workspace_bytes": -1}, ValueError, "max_workspace_bytes: expected 0 or more bytes, got -1"),
        ({"max_workspace_bytes": 1.5}, TypeError, "max_workspace_bytes: expected an integer number of bytes or None"),
        ({"deterministic": "yes"}, TypeError, "deterministic: expected True or False, got 'yes'"),
        ({"max_workspace_bytes": 10, "k_batch": 2}, ValueError,
         "max_workspace_bytes: 10, but the plan of the given options needs 8704 bytes of workspace"),
    ],
)  # fmt: skip
def test_compile_op_refuses_a_bad_or_unmet_request_before_compiling(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        compile_op(TINY, "host", cache=False, **kwargs)


def test_compile_op_without_cache_builds_the_plan_that_meets_the_limit(monkeypatch):
    from convbw_mlir.dispatch import api

    built = []
    monkeypatch.setattr(api, "build_op", lambda problem, tgt, plan, *a, **k: built.append(plan))
    compile_op(CONV, "sm_80", cache=False, max_workspace_bytes=0)
    assert built[0].workspace_bytes == 0


def test_cli_select_takes_the_requests_and_names_an_unmet_one(capsys):
    from convbw_mlir.cli import main

    ck = "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1"
    assert main(["select", "--ck", ck, "--target", "sm_80", "--max-workspace-bytes", "0", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "workspace: 0 bytes, deterministic" in out
    assert main(["select", "--ck", "2 1 1 8 8 3 3 4 4 1 1 1 1 1 1 1 1", "--target", "host",
                 "--max-workspace-bytes", "100"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("convbw: error: max_workspace_bytes: 100: every plan of") and err.count("\n") == 1
    assert main(["select", "--ck", ck, "--max-workspace-bytes", "-5"]) == 1
    assert "argument --max-workspace-bytes: must be >= 0, got -5" in capsys.readouterr().err
