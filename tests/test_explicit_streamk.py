"""StreamK in the explicit sm_80 kernel (convbw_mlir/kernels/streamk_sm80.py): the plan's option and its
refusals, the work partition the kernel's index arithmetic follows, and the isolated sm_80 compile.

Numerics need the GPU: bench/explicit_streamk.py checks them there (docs/explicit-kernels.md "StreamK");
lit/explicit/streamk*.test check the kernel's IR (the persistent loop, the flag wait, the fixups)."""

from __future__ import annotations

import itertools

import pytest

from convbw_mlir.compiler import compile_op, executable_intermediates
from convbw_mlir.kernels.shapes import GemmTiling, gemm_shape
from convbw_mlir.kernels.streamk_sm80 import StreamK
from convbw_mlir.plan import Plan, PlanError, Split, StreamKPlan, check_plan, decide
from convbw_mlir.problem import ConvBwdWeightProblem as P

CK = P.from_ck("2 1 32 256 64 1 1 56 56 1 1 1 1 0 0 0 0", layout=4)  # CK's StreamK problem: 2 tiles x 1568 k tiles


def test_streamk_plan_records_workgroups_and_fixup_and_round_trips():
    plan = decide(CK, "sm_80", strategy="explicit", streamk=132, streamk_fixup="tree")
    assert plan.streamk == StreamKPlan(132, "tree") and plan.split is None
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.to_dict()["streamk"] == {"workgroups": 132, "fixup": "tree"}


def test_streamk_is_off_by_default_and_auto_takes_the_targets_sms():
    assert decide(CK, "sm_80", strategy="explicit").streamk is None
    assert decide(CK, "sm_80", strategy="explicit", streamk="auto").streamk == StreamKPlan(108, "linear")


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        ("sm_80", {"streamk": 132}, r"streamk: 132 applies to strategy explicit only"),
        ("sm_80", {"strategy": "explicit", "streamk": 132, "k_batch": 4}, r"k-batch: 4: StreamK replaces split-K"),
        ("sm_80", {"strategy": "explicit", "streamk": 0}, r"streamk: expected auto or a positive number.*got 0"),
        ("sm_80", {"strategy": "explicit", "streamk": "many"}, r"streamk: expected .* got 'many'"),
        ("sm_80", {"strategy": "explicit", "streamk": 132, "streamk_fixup": "ring"}, r"streamk-fixup: .* got 'ring'"),
        ("sm_80", {"strategy": "explicit", "streamk_fixup": "tree"}, r"streamk-fixup: tree needs streamk"),
        ("gfx942", {"strategy": "explicit", "streamk": 132}, r"streamk: 132 on target gfx942"),
    ],
)
def test_streamk_options_are_refused_naming_the_option_and_value(target, options, message):
    with pytest.raises(PlanError, match=message):
        decide(CK, target, **options)


def test_streamk_refuses_what_the_explicit_kernel_does_not_take_by_name():
    with pytest.raises(PlanError, match=r"layout: GNHWC"):
        decide(CK.with_(layout=1), "sm_80", strategy="explicit", streamk=132)
    with pytest.raises(PlanError, match=r"dtype: bf16"):
        decide(CK.with_(dtype="bf16"), "sm_80", strategy="explicit", streamk=132)


def test_a_given_streamk_plan_with_a_split_or_bad_fixup_is_refused_before_compiling():
    plan = decide(CK, "sm_80", strategy="explicit", streamk=132)
    with pytest.raises(PlanError, match=r"split: r x 4 \(StreamK replaces split-K\)"):
        check_plan(CK, Plan(**{**plan.__dict__, "split": Split("r", 4, 392)}))
    with pytest.raises(PlanError, match=r"streamk-fixup: 'ring'"):
        check_plan(CK, Plan(**{**plan.__dict__, "streamk": StreamKPlan(132, "ring")}))
    with pytest.raises(PlanError, match=r"streamk: 0 workgroups"):
        check_plan(CK, Plan(**{**plan.__dict__, "streamk": StreamKPlan(0)}))


def _segments(sk: StreamK, w: int) -> list[tuple[int, int, int]]:
    """(tile, lo, hi) of workgroup ``w``'s segments in the kernel's order (last tile first), from the
    same index arithmetic as the kernel's persistent loop."""
    begin, end = sk.begin(w), sk.begin(w + 1)
    last = (end - 1) // sk.iters
    out = []
    for i in range(last + 1 - begin // sk.iters):
        tile = last - i
        t0 = tile * sk.iters
        out.append((tile, max(begin, t0) - t0, min(end, t0 + sk.iters) - t0))
    return out


PARTITIONS = [(1, 392, 132), (2, 1568, 132), (72, 2, 132), (72, 25, 132), (5, 98, 108), (3, 2, 132), (7, 1, 4)]


@pytest.mark.parametrize(("tiles", "iters", "workgroups"), PARTITIONS)
def test_streamk_partition_covers_each_k_iteration_once_and_waits_only_on_lower_workgroups(tiles, iters, workgroups):
    sk = StreamK(tiles, iters, min(workgroups, tiles * iters))
    covered = {t: [] for t in range(tiles)}
    for w in range(sk.workgroups):
        segs = _segments(sk, w)
        assert segs, f"workgroup {w} has no work"
        for k, (tile, lo, hi) in enumerate(segs):
            assert 0 <= lo < hi <= iters
            covered[tile].append((lo, hi, w))
            if hi < iters:  # a partial: only a range's end cuts a tile, so it is the workgroup's first segment
                assert k == 0
            if lo > 0:  # the finisher's segment is the last it runs
                assert k == len(segs) - 1 or hi < iters
    for tile, parts in covered.items():
        parts.sort()
        assert [p[:2] for p in parts] == list(zip([0] + [p[1] for p in parts[:-1]], [p[1] for p in parts]))
        assert parts[-1][1] == iters
        first, finisher = sk.owner(tile * iters), sk.owner((tile + 1) * iters - 1)
        assert [p[2] for p in parts] == list(range(first, finisher + 1))  # contributors wait on nobody above


def test_streamk_clamps_workgroups_to_the_k_iterations_so_none_is_idle():
    assert StreamK.of(gemm_shape(P(1, 1, 256, 128, (8, 8), (1, 1), layout=4)), GemmTiling(), 132).workgroups == 1
    assert StreamK.of(gemm_shape(CK), GemmTiling(), 132) == StreamK(2, 1568, 132)


def _tree_adds(count: int, levels: int) -> dict[int, list[int]]:
    """Ranks each rank adds in the tree fixup: the kernel's rule (s below rank's lowest set bit, or any s
    for rank 0, and rank + s a contributor)."""
    adds = {}
    for rank in range(count):
        low = rank & -rank
        adds[rank] = [rank + (1 << lv) for lv in range(levels) if (rank == 0 or (1 << lv) < low)
                      and rank + (1 << lv) < count]  # fmt: skip
    return adds


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 33, 131, 132])
def test_tree_fixup_folds_every_contributor_into_the_finisher_exactly_once(count):
    levels = max(1, (132 - 1).bit_length())
    adds = _tree_adds(count, levels)

    def subtree(r: int) -> list[int]:
        return [r, *itertools.chain.from_iterable(subtree(c) for c in adds[r])]

    assert sorted(subtree(0)) == list(range(count))
    assert max(map(len, adds.values())) <= levels


@pytest.mark.parametrize("fixup", ["linear", "tree"])
def test_streamk_kernel_compiles_for_sm80_in_a_child_with_flag_atomics_and_fences(fixup):
    op = compile_op(CK, "sm_80", strategy="explicit", streamk=132, streamk_fixup=fixup, isolate=True, cache=False)
    assert op.plan.streamk == StreamKPlan(132, fixup) and len(op.vmfb) > 10_000
    llvm = executable_intermediates(op.stages["linalg"], "sm_80").isa
    for instruction in ("atomicrmw add", "acq_rel", "llvm.nvvm.membar.gl", "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
                        "llvm.nvvm.cp.async.cg.shared.global.16"):  # fmt: skip
        assert instruction in llvm
