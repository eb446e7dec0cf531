"""The sm_90a weight gradient (issue 24 item 3; convbw_mlir/kernels/conv_sm90.py) under the sm_90a emulator:
TMA im2col loads of x (padding, strides, dilation, ragged reductions across rows and images), MN-major wgmma
operands through their descriptors, split-K partials, against float64."""

from __future__ import annotations

import numpy as np
import pytest
from sm90_emulator import run_conv

from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module, descriptor_mn
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling
from convbw_mlir.problem import numpy_dtype


def reference(dy: np.ndarray, x: np.ndarray, g: ConvSm90) -> np.ndarray:
    """dW ``[G, K, *filter, C]`` flattened to ``[G, K, taps C]`` in float64, straight from the definition (any rank)."""
    d = dy.astype(np.float64).reshape(g.n, *g.out, g.groups, g.k)
    xp = np.zeros((g.n, *(s + 2 * p + 64 for s, p in zip(g.spatial, g.pad)), g.groups, g.c))
    inside = tuple(slice(p, p + s) for s, p in zip(g.spatial, g.pad))
    xp[(slice(None), *inside)] = x.astype(np.float64).reshape(g.n, *g.spatial, g.groups, g.c)
    out = np.zeros((g.groups, g.k, *g.filter, g.c))
    letters = "dhw"[3 - g.rank :]
    for tap in np.ndindex(*g.filter):
        window = tuple(slice(f * dl, f * dl + s * o, s) for f, dl, s, o in zip(tap, g.dilation, g.stride, g.out))
        out[(slice(None), slice(None), *tap)] = np.einsum(
            f"n{letters}gk,n{letters}gc->gkc", d, xp[(slice(None), *window)]
        )
    return out.reshape(g.groups, g.k, -1)


def emulated(g: ConvSm90, dtype: str = "f16", out: str = "f32", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((g.reduction, g.groups * g.k)).astype(numpy_dtype(dtype))
    x = rng.standard_normal((g.n, *g.spatial, g.groups * g.c)).astype(numpy_dtype(dtype))
    with new_context(), ir.Location.unknown():
        module = conv_module(g, dtype, out)
        c = run_conv(module, dy, x, g, numpy_dtype(out))
    if g.splits > 1 and not g.fused:
        assert not np.isnan(c).any()
        c = c.sum(0)
    return c.astype(np.float32), reference(dy, x, g)


def _error(c: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(c.astype(np.float64) - ref).max() / np.abs(ref).max())


SMALL = Sm90Tiling(bn=128, stages=2)


@pytest.mark.parametrize(
    ("geometry", "note"),
    [
        # 3x3 pad 1 on a 5x7 image: 70 output positions, k tiles cross rows and images, the last ragged;
        # Y X C = 576 is 4.5 tiles of 128 (the last half out of dW), K = 64 leaves consumer 1 idle
        (dict(n=2, h=5, w=7, c=64, k=64, fy=3, fx=3, ho=5, wo=7, pad=(1, 1)), "pad"),
        # stride 2, no padding on the high side (h, w odd), 2 splits of the k tiles
        (dict(n=7, h=9, w=11, c=64, k=128, fy=3, fx=3, ho=4, wo=5, stride=(2, 2), splits=2), "stride 2"),
        # 1x1 stride 2 (ResNet's downsample) and a 2-dilated 2x2 filter with uneven padding
        (dict(n=2, h=8, w=6, c=128, k=64, fy=1, fx=1, ho=4, wo=3, stride=(2, 2)), "1x1 stride 2"),
        # K = 88: dy's box reads zeros past K, the last consumer stores rows 64..87 only
        (dict(n=1, h=8, w=8, c=64, k=88, fy=3, fx=3, ho=8, wo=8, pad=(1, 1)), "ragged K"),
        # 3 groups of K = 40, C = 64, 2 splits: a group's row tile reads the next group's dy past K (never
        # stored), its x boxes start at channel 64 g
        (dict(n=2, h=6, w=6, c=64, k=40, fy=3, fx=3, ho=6, wo=6, pad=(1, 1), groups=3, splits=2), "groups"),
        (dict(n=1, h=9, w=9, c=64, k=64, fy=2, fx=2, ho=8, wo=8, dilation=(2, 2), pad=(1, 1)), "dilation"),
    ],
)
def test_conv_weight_gradient_matches_float64_under_emulation(geometry, note):
    g = ConvSm90(**geometry, tiling=SMALL)
    c, ref = emulated(g)
    assert not np.isnan(c).any(), note  # every element of dW written
    assert _error(c, ref) < 1e-6, note


@pytest.mark.parametrize(
    ("geometry", "note"),
    [
        # 1-D (a 3-D im2col map, one offset): stride 2, dilation 2, pad 3 (wav2vec2 / Whisper / TCN's kinds); 105
        # positions: k tiles cross images
        (dict(n=3, h=1, w=70, c=64, k=64, fy=1, fx=3, ho=1, wo=35, stride=(2,), dilation=(2,), pad=(3,)), "1-D"),
        # 3-D (a 5-D map, three offsets): a 2x2x2 filter, stride (1, 2, 1), depth dilation 2 and uneven pads: taps
        # differ in every dim, k tiles cross rows, planes and images; 2 groups, 2 splits
        (
            dict(
                n=2,
                d=5,
                h=5,
                w=4,
                c=64,
                k=40,
                fz=2,
                fy=2,
                fx=2,
                do=3,
                ho=3,
                wo=5,
                stride=(1, 2, 1),
                dilation=(2, 1, 1),
                pad=(0, 1, 1),
                groups=2,
                splits=2,
            ),
            "3-D",
        ),  # fmt: skip
    ],
)
def test_1d_and_3d_weight_gradients_match_float64_under_emulation(geometry, note):
    g = ConvSm90(**geometry, tiling=SMALL)
    c, ref = emulated(g)
    assert not np.isnan(c).any(), note
    assert _error(c, ref) < 1e-6, note


def test_3d_bf16_weight_gradient_of_an_r3d_layer_shape_matches_float64():
    # R3D-18 layer3's strided 3x3x3 (pad 1, stride 2) on a small clip, dW in bf16
    g = ConvSm90(n=1, d=4, h=5, w=5, c=64, k=64, fz=3, fy=3, fx=3, do=2, ho=3, wo=3, stride=(2, 2, 2),
                 dilation=(1, 1, 1), pad=(1, 1, 1), tiling=SMALL)  # fmt: skip
    c, ref = emulated(g, "bf16", "bf16")
    assert not np.isnan(c).any() and _error(c, ref) < 1e-2


def test_persistent_grid_carries_the_ring_across_units_of_uneven_length():
    # 5 column tiles x 3 splits (k tiles 3, 3, 1) = 15 units on 4 workgroups: 4, 4, 4 and 3 units each, the
    # ring of a 2-stage pipeline running on across them (its phases depend on every earlier unit's length)
    g = ConvSm90(n=4, h=10, w=11, c=64, k=64, fy=3, fx=3, ho=10, wo=11, pad=(1, 1), splits=3,
                 tiling=Sm90Tiling(bn=128, stages=2, persistent=4))  # fmt: skip
    assert (g.ktiles, g.chunk, g.units, g.grid) == (7, 3, 15, (4, 1, 1))
    c, ref = emulated(g)
    assert not np.isnan(c).any() and _error(c, ref) < 1e-6


@pytest.mark.parametrize(
    ("geometry", "note"),
    [
        # 5 column tiles of 2 k tiles on 3 workgroups (ranges [0, 3), [3, 6), [6, 10)): tiles 1 and 2 cut at
        # the seams, each finisher adding one contributor's partial
        (dict(n=2, h=5, w=7, c=64, k=128, fy=3, fx=3, ho=5, wo=7, pad=(1, 1), streamk=3), "seams"),
        # one tile of 7 k tiles on 3 workgroups: its finisher (2) waits on two contributors (0, 1)
        (dict(n=4, h=10, w=11, c=64, k=64, fy=2, fx=1, ho=9, wo=11, streamk=3), "three contributors"),
        # 3 groups x 5 column tiles, K = 40 (consumer 1 idle: no partial, no flag), 7 workgroups
        (dict(n=2, h=6, w=6, c=64, k=40, fy=3, fx=3, ho=6, wo=6, pad=(1, 1), groups=3, streamk=7), "groups"),
    ],
)
def test_streamk_grid_matches_float64_with_fixups_only_at_the_seams(geometry, note):
    # the emulator runs every workgroup at once, the last first, partials NaN until written, and checks
    # that the flags end as zero: a finisher that does not wait reads NaN, one that does not reset leaves a flag
    g = ConvSm90(**geometry, tiling=SMALL)
    c, ref = emulated(g)
    assert not np.isnan(c).any(), note
    assert _error(c, ref) < 1e-6, note


def test_streamk_bf16_output_and_its_workspace_shapes():
    g = ConvSm90(n=2, h=8, w=8, c=64, k=128, fy=3, fx=3, ho=8, wo=8, pad=(1, 1), tiling=SMALL, streamk=4)
    assert (g.grid, g.sk_total, g.sk_partials) == ((4, 1, 1), 10, [4, 2, 16, 128, 4])  # ranges 2, 3, 2, 3
    c, ref = emulated(g, "bf16", "bf16")
    assert not np.isnan(c).any() and _error(c, ref) < 1e-2


@pytest.mark.parametrize(
    ("geometry", "tiling"),
    [
        # one consumer warpgroup: 64-row tiles (the rule's where K <= 64), 2 splits
        (dict(n=2, h=5, w=7, c=64, k=64, fy=3, fx=3, ho=5, wo=7, pad=(1, 1), splits=2),
         Sm90Tiling(bn=128, stages=2, consumers=1)),
        # 64-column tiles (the rule's where Y X C <= 64): one im2col box a stage
        (dict(n=2, h=5, w=7, c=64, k=128, fy=1, fx=1, ho=5, wo=7, splits=2), Sm90Tiling(bn=64, stages=2)),
    ],
)  # fmt: skip
def test_narrow_tiles_match_float64_under_emulation(geometry, tiling):
    c, ref = emulated(ConvSm90(**geometry, tiling=tiling))
    assert not np.isnan(c).any() and _error(c, ref) < 1e-6


@pytest.mark.parametrize(
    ("geometry", "out"),
    [
        # 3 splits of 7 k tiles (3, 3, 1), 5 column tiles, K = 64 (consumer 1 idle: no count, no sum)
        (dict(n=4, h=10, w=11, c=64, k=64, fy=3, fx=3, ho=10, wo=11, pad=(1, 1), splits=3), "f32"),
        (dict(n=2, h=6, w=6, c=64, k=128, fy=3, fx=3, ho=6, wo=6, pad=(1, 1), splits=2, groups=2), "bf16"),
    ],
)
def test_fused_split_sums_its_partials_in_the_kernel_and_resets_its_counters(geometry, out):
    # the last split runs first, so the thread that sums is the first split's; its counters must end at zero
    g = ConvSm90(**geometry, tiling=SMALL, fused=True)
    c, ref = emulated(g, "bf16" if out == "bf16" else "f16", out)
    assert not np.isnan(c).any() and _error(c, ref) < (1e-2 if out == "bf16" else 1e-6)


def test_bf16_conv_weight_gradient_with_bf16_output_matches_float64():
    g = ConvSm90(n=1, h=6, w=6, c=64, k=128, fy=3, fx=3, ho=6, wo=6, pad=(1, 1), tiling=SMALL)
    c, ref = emulated(g, "bf16", "bf16")
    assert not np.isnan(c).any() and _error(c, ref) < 1e-2


def test_im2col_box_spans_exactly_the_output_positions():
    # walking [lower, dim - 1 + upper] at the stride visits Ho x Wo positions, whatever the padding
    g = ConvSm90(n=1, h=56, w=56, c=64, k=64, fy=3, fx=3, ho=28, wo=28, stride=(2, 2), pad=(1, 1))
    (lw, lh), (uw, uh) = g.corners()
    assert len(range(lw, g.w + uw, 2)) == g.wo and len(range(lh, g.h + uh, 2)) == g.ho


def test_im2col_box_of_a_3d_convolution_spans_the_output_in_every_dim():
    # innermost first: (w, h, d); each walked at its stride visits the output's positions
    g = ConvSm90(n=1, d=8, h=28, w=27, c=64, k=64, fz=3, fy=3, fx=3, do=4, ho=14, wo=14, stride=(2, 2, 2),
                 dilation=(1, 1, 1), pad=(1, 1, 1))  # fmt: skip
    lower, upper = g.corners()
    assert lower == (-1, -1, -1) and len(upper) == 3
    for lo, up, size, s, o in zip(lower, upper, g.spatial[::-1], g.stride[::-1], g.out[::-1]):
        assert len(range(lo, size + up, s)) == o


def test_mn_major_descriptor_fields():
    d = descriptor_mn(0x1400, 8192)
    assert (d & 0x3FFF, (d >> 16) & 0x3FFF, (d >> 32) & 0x3FFF, d >> 62) == (0x140, 512, 64, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(c=44), "in_channels: 44"),  # C % 8: x's box starts off 16 bytes (C % 64 != 0 is padded to boxes)
        (dict(c=72, streamk=1), r"in_channels: 72 \(padded to 128: the plain split-K grid only"),
        (dict(k=100), "out_channels: 100"),
        (dict(splits=100), "splits: 100"),
        (dict(stride=(1, 1, 1)), "stride: "),  # a 3-D stride needs 3-D dilation and pad
        (dict(d=2, stride=(1, 1), dilation=(1, 1), pad=(0, 0)), "d: 2"),  # depth in a 2-D convolution
        (dict(n=8, splits=2, streamk=4), r"streamk: 4 \(with splits 1"),
        (dict(streamk=1000), r"streamk: 1000 \(0 \.\. 1 iterations"),
    ],
)
def test_conv_geometry_refuses_what_the_kernel_cannot_take(fields, message):
    base = dict(n=1, h=4, w=4, c=64, k=64, fy=1, fx=1, ho=4, wo=4)
    with pytest.raises(ValueError, match=message):
        ConvSm90(**{**base, **fields})


# -- the boxed form: thin and medium groups (ConvSm90.merge; issue 40 item 2) --------------------------------
@pytest.mark.parametrize(
    ("geometry", "note"),
    [
        # ResNeXt's 4-channel groups, 16 a box: 20 groups leave the last box 4 (its other 12 read the map's zeros
        # past G C and dy's past G K); 70 positions: a ragged second k tile; rows 64..127 of the tile past 16 K
        (dict(n=2, h=5, w=7, c=4, k=4, fy=3, fx=3, ho=5, wo=7, pad=(1, 1), groups=20, merge=16), "thin, ragged"),
        # RegNetY's 56-channel groups, one a box: each tap's box reads the next group's first 8 channels (dropped)
        (dict(n=2, h=5, w=5, c=56, k=56, fy=3, fx=3, ho=5, wo=5, pad=(1, 1), groups=3, merge=1), "medium, 56"),
        # 24-channel groups, 2 a box (48 of 64 channels), 5 groups (the last box one), stride 2, 2 splits
        (
            dict(n=6, h=9, w=7, c=24, k=24, fy=3, fx=3, ho=4, wo=3, stride=(2, 2), groups=5, merge=2, splits=2),
            "24, stride 2, split",
        ),  # fmt: skip
        # 6 channels, 10 a box (60 of 64) but only 4 groups: one box, its channels past G C zeros; a 1x1
        (dict(n=2, h=6, w=6, c=6, k=6, fy=1, fx=1, ho=6, wo=6, groups=4, merge=10), "odd box fill, 1x1"),
        # K != C: 8 in, 16 out channels a group, 8 a box: 128 GEMM rows over both consumers; 1-D, dilation 2
        (
            dict(
                n=3,
                h=1,
                w=40,
                c=8,
                k=16,
                fy=1,
                fx=3,
                ho=1,
                wo=36,
                dilation=(2,),
                stride=(1,),
                pad=(0,),
                groups=16,
                merge=8,
            ),
            "K != C, 1-D",
        ),  # fmt: skip
    ],
)
def test_boxed_form_stores_the_block_diagonal_matching_float64_under_emulation(geometry, note):
    g = ConvSm90(**geometry, tiling=SMALL)
    c, ref = emulated(g)
    assert not np.isnan(c).any(), note  # every element of dW written exactly by its diagonal block
    assert _error(c, ref) < 1e-6, note


def test_boxed_form_bf16_output_of_a_3d_thin_group_layer_matches_float64():
    # 3-D (a 5-D im2col map), 8-channel groups, 8 a box, dW rounded to bf16 in the store
    g = ConvSm90(n=1, d=4, h=4, w=4, c=8, k=8, fz=3, fy=3, fx=3, do=4, ho=4, wo=4, stride=(1, 1, 1),
                 dilation=(1, 1, 1), pad=(1, 1, 1), groups=8, merge=8, tiling=SMALL)  # fmt: skip
    c, ref = emulated(g, "bf16", "bf16")
    assert not np.isnan(c).any()
    assert _error(c, ref) < 1e-2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(c=8, k=8, groups=16, merge=9), r"merge: 9 groups of 8 channels \(1 \.\. 8"),
        (dict(c=6, k=6, groups=2, merge=2), r"groups: 2 x 6 in, 6 out channels"),  # G C = 12: not 16-byte rows
        (dict(c=5, k=8, groups=8, merge=4), r"in_channels: 5 \(the boxed form stores pairs"),
        (dict(c=8, k=8, groups=8, merge=8, n=8, streamk=4), r"merge: the boxed form runs the plain split-K grid"),
    ],
)
def test_boxed_geometry_refuses_with_the_field_and_its_value(fields, message):
    base = dict(n=1, h=4, w=4, fy=1, fx=1, ho=4, wo=4)
    with pytest.raises(ValueError, match=message):
        ConvSm90(**{**base, **fields})


# -- the policy (convbw_mlir/policies/sm90.py) ---------------------------------------------------------------
def _problem(line: str, **fields):
    from convbw_mlir.problem import ConvBwdWeightProblem

    return ConvBwdWeightProblem.from_ck(line).with_(**{"layout": 2, **fields})


def test_policy_takes_a_channels_last_2d_layer_of_one_group_or_of_64_channel_groups():
    from convbw_mlir.policies import sm90

    assert sm90.refusals(_problem("2 1 64 256 256 3 3 56 56 1 1 1 1 1 1 1 1")) == []
    assert sm90.refusals(_problem("2 2 64 64 64 3 3 56 56 1 1 1 1 1 1 1 1")) == []


@pytest.mark.parametrize(
    "line",
    [
        "1 1 8 512 512 3 3199 2 1 0 0",  # wav2vec2's conv1 (1-D, stride 2)
        "1 1 4 128 128 3 8000 1 4 4 4",  # a TCN layer (1-D, dilation 4)
        "3 1 8 256 128 3 3 3 8 28 28 2 2 2 1 1 1 1 1 1 1 1 1",  # R3D-18 layer3's strided 3x3x3
        "3 1 8 144 64 1 3 3 16 56 56 1 1 1 1 1 1 0 1 1 0 1 1",  # R(2+1)D's spatial 1x3x3
    ],
)
def test_policy_takes_the_1d_and_3d_classes_layers_with_64_channel_multiples(line):
    from convbw_mlir.policies import sm90

    assert sm90.refusals(_problem(line)) == []


def test_tensor_maps_of_a_3d_problem_are_a_5d_im2col_map_with_3_corners():
    from convbw_mlir.cuda_launch import TensorMap
    from convbw_mlir.policies import sm90

    p = _problem("3 1 8 256 128 3 3 3 8 28 28 2 2 2 1 1 1 1 1 1 1 1 1")
    dy, x = (TensorMap(**m) for m in sm90.tensor_maps(p, "k"))
    assert dy.dims == (256, 8 * 4 * 14 * 14) and x.mode == "im2col"
    assert x.dims == (128, 28, 28, 8, 8) and x.strides == (256, 256 * 28, 256 * 28 * 28, 256 * 28 * 28 * 8)
    assert x.element_strides == (1, 2, 2, 2, 1) and x.lower == (-1, -1, -1) and x.upper == (-2, -2, -2)


@pytest.mark.parametrize(
    ("line", "fields", "reason"),
    [
        ("2 1 64 256 256 3 3 56 56 1 1 1 1 1 1 1 1", {"layout": 4}, "layout: "),
        ("2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1", {}, "in_channels: 4"),  # ResNeXt's thin groups
        ("2 1 64 64 3 7 7 224 224 2 2 1 1 3 3 3 3", {}, "in_channels: 3"),
        ("2 1 64 100 256 3 3 56 56 1 1 1 1 1 1 1 1", {}, "out_channels: 100"),
        # a 5-D im2col map's corners are 5-bit: pad 20 is past them
        ("3 1 8 64 64 3 3 3 8 8 8 1 1 1 1 1 1 20 1 1 20 1 1", {}, "pad: "),
        # a traversal stride of 16 (a 16x16 patchify) is past the map's elementStrides (at most 8)
        ("2 1 8 64 64 16 16 224 224 16 16 1 1 0 0 0 0", {}, "stride: "),
        ("2 1 64 256 256 3 3 56 56 1 1 1 1 1 1 1 1", {"dtype": "f32", "dw_dtype": "f32"}, "dtype: f32"),
    ],
)
def test_policy_refuses_with_the_field_and_its_value(line, fields, reason):
    from convbw_mlir.policies import sm90

    assert any(r.startswith(reason) for r in sm90.refusals(_problem(line, **fields)))


@pytest.mark.parametrize(
    ("mnr", "choice"),
    [
        ((256, 2304, 64 * 56 * 56), (256, 7, 0)),  # large_3x3_256_n64_56: 7 splits of the 18 wide tiles
        ((128, 1152, 32 * 28 * 28), (128, 14, 0)),  # streamk_3x3_128_n32_28: 9 narrow tiles x 14 splits
        # streamk_3x3_512_n32_7: 96 tiles of 192 in one wave; StreamK's partials cost more than the wave gains
        # (H200: 24.1-26.2 us against 18.7)
        ((512, 4608, 32 * 7 * 7), (192, 1, 0)),
        # retina_k2376_100: 171 tiles of 256 on 132 SMs; StreamK evens them (H200: 301.5 us against 3 splits' 342.6)
        ((2376, 2304, 2 * 100 * 100), (256, 1, 132)),
        # K = 64: 64-row tiles (one consumer), one wave of splits (held-out resnet50_3x3_64_n256_56: 143.6 us
        # against 258.4 with 128-row tiles), and the 1x1 256 -> 64 likewise
        ((64, 576, 256 * 56 * 56), (192, 44, 0)),
        ((64, 256, 256 * 56 * 56), (256, 131, 0)),
        ((256, 64, 256 * 56 * 56), (64, 66, 0)),  # Y X C = 64: 64-column tiles (126.8 us against 152.8)
    ],
)
def test_rule_picks_the_split_or_streamk_that_measured_fastest(mnr, choice):
    """bench/results/h100_2026-11-26_hopper_conv (the split rule) and h200_2026-11-26_hopper_perf (StreamK)."""
    from convbw_mlir.policies import sm90

    assert sm90.choose(*mnr) == choice


def test_streamk_on_a_3d_and_a_1d_convolution_matches_float64():
    # StreamK's units walk the same producer as split-K: the N-D im2col box serves it at every rank
    g3 = ConvSm90(n=2, d=3, h=4, w=4, c=64, k=128, fz=3, fy=3, fx=3, do=3, ho=4, wo=4, stride=(1, 1, 1),
                  dilation=(1, 1, 1), pad=(1, 1, 1), tiling=SMALL, streamk=3)  # fmt: skip
    g1 = ConvSm90(n=4, h=1, w=40, c=64, k=128, fy=1, fx=5, ho=1, wo=36, stride=(1,), dilation=(1,), pad=(0,),
                  tiling=SMALL, streamk=3)  # fmt: skip
    for g in (g3, g1):
        c, ref = emulated(g)
        assert not np.isnan(c).any() and _error(c, ref) < 1e-6, g
