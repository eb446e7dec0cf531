"""An output-row split (``split_dim = "o<i>"``) computed by the lowering's own linalg, run in numpy.

No plan makes one (docs/decisions.md#no-row-chunks: IREE 3.13 segfaults compiling it, on host too),
but ``convbw-lower-to-linalg`` builds it for a split given by hand, and an uneven one (``k_batch *
chunk`` past the output rows) reads x past the rows the problem's pads give: the lowering pads x
further (``passes/lower_to_linalg.py: _padded_inputs``). ``tests/sm80_emulator.py: run_module``
interprets the lowered module (gather pads, the contraction, stage 2) against float64."""

from __future__ import annotations

import pytest
from sm80_emulator import module_error

from convbw_mlir.loops import Split
from convbw_mlir.plan import Plan, decide
from convbw_mlir.problem import ConvBwdWeightProblem as P


def lowered_error(p: P, split: Split) -> float:
    """Max error of the lowered module with ``split`` against float64, relative to the largest entry."""
    from convbw_mlir.passes.lower_to_linalg import LowerToLinalg
    from convbw_mlir.passes.split_k import SplitK

    plan = Plan(**{**decide(p, "host").__dict__, "split": split})
    return module_error(p, plan, [SplitK(), LowerToLinalg()], seed=1)


@pytest.mark.parametrize(
    ("ck", "split"),
    [
        ("2 1 2 8 4 3 3 7 7 1 1 1 1 1 1 1 1", Split("o0", 3, 3)),  # 7 rows in 3 x 3: 2 rows past the end
        ("2 1 2 8 4 3 3 11 11 2 2 2 2 1 1 1 1", Split("o0", 3, 2)),  # 5 strided, dilated rows in 3 x 2
        ("2 2 3 8 4 3 3 7 7 1 1 1 1 1 1 1 1", Split("o1", 2, 4)),  # columns, 2 groups
    ],
)
def test_uneven_output_row_split_matches_float64(ck, split):
    assert lowered_error(P.from_ck(ck), split) < 2e-3
