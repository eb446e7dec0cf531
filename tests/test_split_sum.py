"""The split sum (stage 2) of the explicit kernels' split plans: its own workgroup tile on NVIDIA where IREE 3.13's
is scalar (``policies.split.sum_tile``; docs/decisions.md#short-reduction-dense item 2), the same bits as the
plain reduction (split order from +0, one rounding, the epilogue in f32), the whole module under the sm_80
emulator at channels whose product is not a multiple of 128, and AMD left as it was. The PTX it makes:
lit/explicit/split_sum.py."""

from __future__ import annotations

import numpy as np
import pytest
from sm80_emulator import module_error, run_module

from convbw_mlir.plan import decide
from convbw_mlir.policies import split
from convbw_mlir.problem import ConvBwdWeightProblem as P
from convbw_mlir.problem import Epilogue, numpy_dtype

BILINEAR = Epilogue("bilinear", alpha=2.0, beta=-0.5)


@pytest.mark.parametrize(
    ("outputs", "units", "tile"),
    [
        (888 * 888, 132, (222, 4)),  # RegNetY-016's 1x1 on an H100: one 888-wide row a workgroup, 888 of them
        (888 * 888, 108, (222, 4)),  # and an A100
        (440 * 440, 132, (220, 4)),  # RegNet-Y-400MF's: 220 workgroups
        (440 * 440, 256, (121, 4)),  # 220 workgroups are too few for 256 SMs: 400 of 121 threads
        (136 * 136, 108, (34, 4)),  # 136 workgroups: 68 threads would leave 68
        (2 * 3 * 37 * 37 * 9, 132, (111, 2)),  # not a multiple of 4: 8-byte loads, 111 / 128 lanes
    ],
)
def test_sum_tile_of_sizes_iree_scalarises_is_a_vector_tile_that_divides_them(outputs, units, tile):
    assert split.sum_tile(outputs, units) == tile


@pytest.mark.parametrize(
    ("outputs", "units"),
    [(512 * 1024, 132), (128, 1), (3 * 37 * 37, 132), (4 * 1009, 1), (136 * 136, 137), (36 * 144, 108)],
)
def test_sum_tile_keeps_irees_own_at_multiples_of_128_odd_sizes_and_where_it_fits_no_workgroup_an_sm(outputs, units):
    """A multiple of 128 is IREE's vector tile already; odd; no divisor of 32-256 threads (4 x a prime); or fewer
    workgroups than SMs (136 x 136 on 137 SMs, 36 x 144 on 108: IREE's 32-wide tiles spread further)."""
    assert split.sum_tile(outputs, units) is None


def test_every_sum_tile_divides_its_outputs_in_whole_vectors_of_full_size_workgroups_one_an_sm_at_least():
    for outputs in range(2, 40_000, 2):
        tile = split.sum_tile(outputs, 132)
        if tile is not None:
            threads, width = tile
            assert 32 <= threads <= split.SUM_THREADS and outputs % (threads * width) == 0, outputs
            assert outputs // (threads * width) >= 132 and outputs % 128, outputs
            assert width == (4 if outputs % 4 == 0 else 2), outputs


def _stage_two(partials: np.ndarray, out: str, epilogue=None, d: np.ndarray | None = None, *, units: int):
    """``_sum_splits`` alone in a module, run by the emulator on ``partials`` (and D): dW and the module's text."""
    from convbw_mlir.passes.explicit_kernel import _sum_splits

    from convbw_mlir.ir_imports import element_type, func_d, ir, new_context

    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        args = [ir.RankedTensorType.get(list(partials.shape), f32)]
        if d is not None:
            args.append(ir.RankedTensorType.get(list(d.shape), f32))
        with ir.InsertionPoint(module.body):

            @func_d.FuncOp.from_py_func(*args, name="stage2")
            def stage2(p, *rest):
                return _sum_splits(p, element_type(out), epilogue, rest[0] if rest else None, units=units)

        assert module.operation.verify()
        return run_module(module, [partials] if d is None else [partials, d]), str(module)


@pytest.mark.parametrize(
    ("shape", "out", "epilogue"),
    [([2, 1, 888, 888], "bf16", None), ([3, 1, 440, 440], "f16", None), ([3, 2, 136, 68], "f16", BILINEAR)],
)
def test_own_tile_sums_splits_in_order_bit_for_bit_at_sizes_iree_scalarises(shape, out, epilogue):
    rng = np.random.default_rng(7)
    partials = rng.standard_normal(shape, np.float32) * 64
    partials[:, 0, 0, :3] = -0.0  # from +0: +0 + -0 + -0 is +0
    d = rng.standard_normal(shape[1:], np.float32) if epilogue is not None else None
    got, text = _stage_two(partials, out, epilogue, d, units=132)
    plain, plain_text = _stage_two(partials, out, epilogue, d, units=0)
    assert "compilation_info" in text and "compilation_info" not in plain_text
    total = np.zeros(shape[1:], np.float32)
    for part in partials:  # split order, in f32
        total = total + part
    if epilogue is not None:
        total = total * np.float32(epilogue.alpha) + d * np.float32(epilogue.beta)
    want = total.astype(numpy_dtype(out))
    # the emulator holds 16-bit results in f32 arrays, rounded: back to their type exactly
    got, plain = (np.asarray(v).astype(want.dtype) for v in (got, plain))
    assert got.shape == want.shape and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(got.view(np.uint16), plain.view(np.uint16))


def _explicit_module(p: P, target: str, **options) -> str:
    """The module of ``p``'s plan (``decide(p, target, **options)``) after ``convbw-explicit-kernel``, as text."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    from convbw_mlir.ir_imports import new_context

    with new_context():
        module = convbw.build_module(p, decide(p, target, **options))
        ExplicitKernel().run(module.operation)
        return str(module)


# A 1x1 of 136 -> 136 channels: 18,496 outputs (64 x 289), 34 threads x 4 on sm_80's 108 SMs; 3 k tiles
ODD = P(1, 3, 136, 136, (8, 8), (1, 1), layout=2)


@pytest.mark.parametrize(
    ("p", "k_batch"),
    [(ODD, 3), (ODD.with_(dtype="bf16", dw_dtype="bf16", epilogue=BILINEAR), 2)],
    ids=["f16", "bf16_bilinear"],
)
def test_split_plan_at_channels_off_128_takes_the_own_tile_and_matches_float64(p, k_batch):
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    text = _explicit_module(p, "sm_80", strategy="explicit", k_batch=k_batch)
    assert f"reduction = [0, {k_batch}], thread = [4, 0], workgroup = [136, 0]" in text
    assert "workgroup_size = [34, 1, 1]" in text
    error = module_error(p, decide(p, "sm_80", strategy="explicit", k_batch=k_batch), [ExplicitKernel()], seed=3)
    assert error < (2.0**-8 if p.dtype == "bf16" else 2e-3)


def test_amd_split_plans_gemv_chunks_and_the_switch_off_keep_the_plain_reduction(monkeypatch):
    assert "compilation_info" not in _explicit_module(ODD, "gfx942", strategy="explicit", k_batch=3)
    # K = 3: the GEMV kernel's 233 chunks over 23,976 outputs, which sum_tile would tile (37 x 4)
    gemv = P(1, 32, 888, 3, (28, 28), (3, 3), pad_low=1, pad_high=1, layout=2)
    assert decide(gemv, "sm_90a").gemv is not None and split.sum_tile(888 * 27, 132) is not None
    assert "compilation_info" not in _explicit_module(gemv, "sm_90a")
    monkeypatch.setattr(split, "OWN_SUM_TILE", False)
    assert split.sum_tile(888 * 888, 132) is None
    assert "compilation_info" not in _explicit_module(ODD, "sm_80", strategy="explicit", k_batch=3)
