"""The explicit kernels' whole modules run on the CPU against float64: the kernel under the sm_80
emulator and the module's own tensor ops around it (the reshapes, a split's stage 2 from
``passes/explicit_kernel.py: _sum_splits``, StreamK's workspace and flags), so each test runs the
product's code, not a copy of its rules. The GPU numbers: docs/explicit-kernels.md.

Each test here kills a mutant the suite once let through (docs/mutation.md, issue 28)."""

from __future__ import annotations

import numpy as np
import pytest
from sm80_emulator import _Block, _Group, module_error

from convbw_mlir.kernels import gemm_sm80
from convbw_mlir.plan import decide
from convbw_mlir.policies.sm80 import gemm_shape
from convbw_mlir.problem import ConvBwdWeightProblem as P


def emulated_error(p: P, **options) -> float:
    """Max error of the emulated module (kernel and tensor ops) against float64, relative to the largest entry."""
    from convbw_mlir.passes.explicit_kernel import ExplicitKernel

    return module_error(p, decide(p, "sm_80", strategy="explicit", **options), [ExplicitKernel()], seed=3)


@pytest.mark.parametrize(
    "ck",
    [
        "2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1",  # stride 2
        "2 1 2 16 8 3 3 9 9 1 1 2 2 1 1 1 1",  # dilation 2
        "2 1 2 16 8 3 3 11 11 2 2 2 2 2 2 0 0",  # both, padded low only
    ],
)
def test_layout4_gather_matches_float64_with_stride_dilation_and_padding(ck):
    assert emulated_error(P.from_ck(ck, layout=4)) < 2e-3


@pytest.mark.parametrize(("dw_dtype", "k_batch"), [("f32", 3), ("f16", 2)])
def test_split_partials_are_summed_by_the_modules_own_stage_two(dw_dtype, k_batch):
    """``_sum_splits`` (zero-filled f32 sum, then rounding to dW's type) runs as the module has it."""
    p = P.from_ck("2 2 4 36 16 3 3 7 7 1 1 1 1 1 1 1 1", layout=4).with_(dw_dtype=dw_dtype)
    assert emulated_error(p, k_batch=k_batch) < 2e-3


@pytest.mark.parametrize(
    ("ck", "workgroups", "fixup"),
    [
        ("2 2 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 3, "linear"),  # 2 tiles x 8 k tiles: both tiles split
        ("2 2 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 5, "tree"),  # 5 contributors: levels 1 and 2 of the tree
        ("2 1 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 7, "tree"),  # one tile, 7 ranks: a rank with two children
        ("2 1 2 16 8 1 1 16 16 1 1 1 1 0 0 0 0", 4, "linear"),  # one tile: the finisher adds 3 partials
        ("2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1", 3, "linear"),  # gathered (strided, padded) x
    ],
)
def test_streamk_partition_and_fixup_match_float64_under_emulation(ck, workgroups, fixup):
    """The persistent loop, the partial stores, the flag waits and the fixup of the kernel as built;
    workgroups run in order, so a wait on a later workgroup spins out (``Deadlock``)."""
    p = P.from_ck(ck, layout=4)
    assert emulated_error(p, streamk=workgroups, streamk_fixup=fixup) < 2e-3


@pytest.mark.parametrize(
    "ck",
    [
        "2 1 2 16 8 3 3 9 9 2 2 1 1 1 1 1 1",
        "2 1 2 16 8 3 3 11 11 2 2 2 2 2 2 0 0",
        "2 1 3 4 4 3 2 7 8 3 1 1 3 1 2 2 0",  # unequal filter, strides, dilations and pads per dimension
        "2 1 2 4 4 3 3 6 6 1 1 1 1 2 2 2 2",  # the last rows read 1 past the image's end and more
        "2 1 2 4 4 3 3 3 3 2 2 1 1 1 1 1 1",  # 2 output rows, stride 2: the bound from one output step
        "2 1 2 4 4 3 3 2 2 1 1 1 1 1 1 1 1",  # 2 output rows, stride 1: the filter's reach alone passes the end
        "2 1 2 4 4 3 3 6 6 1 1 1 1 0 0 2 2",  # padding after the image only
    ],
)
def test_gather_address_map_shared_with_the_amd_kernel_matches_an_index_computation(ck):
    """``gemm_sm80._element_address`` (the gather of x the CDNA and RDNA kernels import) against the
    convolution's own index formula, for every (row, reduction index) of a small problem."""
    from iree.compiler.dialects import func

    from convbw_mlir.ir_imports import ir, new_context

    p = P.from_ck(ck, layout=4)
    shape = gemm_shape(p)
    conv = shape.conv
    rows, red = np.meshgrid(np.arange(shape.n), np.arange(shape.reduction), indexing="ij")
    rows, red = rows.ravel(), red.ravel()
    with new_context(), ir.Location.unknown():
        index = ir.IndexType.get()
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("address", ([index, index, index], []))
            entry = fn.add_entry_block()
            with ir.InsertionPoint(entry):
                g, row, r = entry.arguments
                op = gemm_sm80._Operand(None, None, None, 0, shape.n, 1, gather=True)
                idx, ok = gemm_sm80._element_address(gemm_sm80._Ix(entry), shape, op, g, row, r, [])
                func.ReturnOp([])
        emu = _Block(len(rows), (0, 0, 0), {})
        emu.env.update({g: np.int64(0), row: rows, r: red})
        for o in entry.operations:
            for _ in emu.step(o.operation, _Group(None)):
                pass
        got = [emu.idx(v) for v in idx]
        real = np.ones(len(rows), bool) if ok is None else np.broadcast_to(emu.get(ok), (len(rows),))
    c, tap = rows // conv.taps, rows % conv.taps
    fy, fx = tap // p.filter_size[1], tap % p.filter_size[1]
    image, pos = red // shape.hw, red % shape.hw
    oy, ox = pos // p.output_size[1], pos % p.output_size[1]
    h = oy * p.stride[0] + fy * p.dilation[0] - p.pad_low[0]
    w = ox * p.stride[1] + fx * p.dilation[1] - p.pad_low[1]
    inside = (h >= 0) & (h < p.input_size[0]) & (w >= 0) & (w < p.input_size[1])
    np.testing.assert_array_equal(real, inside)
    for name, have, want in (("image", got[0], image), ("c", got[2], c), ("h", got[3], h), ("w", got[4], w)):
        np.testing.assert_array_equal(have[inside], want[inside], err_msg=name)
    assert (got[3] >= 0).all() and (got[3] < p.input_size[0]).all() and (got[4] < p.input_size[1]).all()
