"""ckProfiler and MIOpenDriver lines: exact round trips, CK's own test list, clear errors."""

from dataclasses import replace

import pytest
from conftest import suite
from hypothesis import given, settings
from hypothesis import strategies as st

from convbw_mlir.formats import CkCommand, format_miopen, parse_ck, parse_miopen
from convbw_mlir.problem import ConvBwdWeightProblem


def ck(line):
    """A ckProfiler line's command with its problem built (the codec itself returns the problem's fields)."""
    cmd = parse_ck(line)
    return replace(cmd, problem=ConvBwdWeightProblem(**cmd.problem))


def miopen(line):
    return ConvBwdWeightProblem(**parse_miopen(line))


ALL_SUITE_LINES = suite("ck_test_grouped_convnd_bwd_weight") + suite("seeds") + suite("models")


@pytest.mark.parametrize("name, args", ALL_SUITE_LINES, ids=[n for n, _ in ALL_SUITE_LINES])
def test_every_suite_line_parses_and_prints_back_identically(name, args):
    p = ConvBwdWeightProblem.from_ck(args)
    assert p.to_ck() == args
    assert p.rank == int(args.split()[0])


def test_ck_problem_part_reads_in_ckprofiler_order():
    # NDim G N K C <filter> <input> <strides> <dilations> <left pads> <right pads>
    p = ConvBwdWeightProblem.from_ck("2 2 4 128 256 3 3 14 14 1 1 1 1 1 1 1 1")
    assert (p.groups, p.batch, p.out_channels, p.in_channels) == (2, 4, 128, 256)
    assert p.filter_size == (3, 3) and p.input_size == (14, 14)


def test_ck_whole_command_line_keeps_switches_and_split_k():
    line = "grouped_conv_bwd_weight 2 1 1 1 0 1 2 32 4 192 192 3 3 28 28 1 1 1 1 1 1 1 1 4"
    cmd = ck("ckProfiler " + line)
    assert cmd.problem.dtype == "bf16" and cmd.problem.dw_dtype == "f32"  # type code 2
    assert cmd.problem.layout == "GNHWC/GKYXC/GNHWK"  # layout code 1
    assert (cmd.verify, cmd.init, cmd.log, cmd.time, cmd.split_k) == (1, 1, 0, 1, 4)
    assert cmd.format() == line


@pytest.mark.parametrize(
    "code, types", [(0, ("f32", "f32")), (1, ("f16", "f16")), (2, ("bf16", "f32")), (5, ("bf16", "bf16"))]
)
def test_ck_type_codes(code, types):
    cmd = ck(f"grouped_conv_bwd_weight {code} 2 1 1 0 1 1 1 1 4 4 3 8 1 1 0 0 0")
    assert (cmd.problem.dtype, cmd.problem.dw_dtype) == types
    assert ck(cmd.format()) == cmd


@pytest.mark.parametrize(
    "line, match",
    [
        ("grouped_conv_bwd_weight 4 2 1 1 0 1 1 1 1 4 4 3 8 1 1 0 0 0", r"data type: ckProfiler code 4 \(fp8\)"),
        ("grouped_conv_bwd_weight 9 2 1 1 0 1 1 1 1 4 4 3 8 1 1 0 0 0", "code 9 .unknown"),
        ("grouped_conv_bwd_weight 1 7 1 1 0 1 1 1 1 4 4 3 8 1 1 0 0 0", "layout: unknown layout 7"),
        ("grouped_conv_fwd 1 2 1 1 0 1 1 1 1 4 4 3 8 1 1 0 0 0", "operation"),
        ("2 1 1 4 4 3 3 8 8 1 1 1 1 0 0", "NDim=2 takes 17"),
        ("4 1 1 4 4 3 8 1 1 0 0", "NDim: expected 1, 2 or 3, got 4"),
        ("1 1 1 4 4 3 x 1 1 0 0", "ck problem: expected integers"),
        ("1 1 1 4 4 9 8 1 1 0 0", "filter_size"),
    ],
)
def test_bad_ck_lines_raise_naming_the_field(line, match):
    with pytest.raises(ValueError, match=match):
        ck(line)


def test_layout_without_ck_code_cannot_print_as_ck():
    p = ConvBwdWeightProblem(1, 2, 3, 4, (8, 8), (3, 3), layout="torch")
    with pytest.raises(ValueError, match="layout: NCHW/KCYX/NKHW has no ckProfiler layout code"):
        p.to_ck()


MIOPEN_2D = "convfp16 -F 4 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -m conv -g 1"


def test_miopen_2d_line_reads_totals_per_group_and_prints_back():
    p = miopen(MIOPEN_2D)
    assert (p.batch, p.in_channels, p.out_channels, p.groups) == (4, 64, 64, 1)
    assert p.layout == "NGCHW/GKCYX/NGKHW" and p.dtype == "f16"
    assert format_miopen(p) == MIOPEN_2D
    g = miopen("convbfp16 -F 4 -n 2 -c 64 -H 8 -W 8 -k 32 -y 3 -x 3 -g 4 -t 1 -V 0")
    assert (g.in_channels, g.out_channels, g.groups, g.dtype) == (16, 8, 4, "bf16")


def test_miopen_3d_flags_with_short_and_long_spellings():
    short = "conv -F 4 -n 2 -c 8 -! 4 -H 6 -W 6 -k 8 -@ 3 -y 3 -x 3 -$ 1 -p 1 -q 1 -# 2 -u 1 -v 1 -^ 1 -l 1 -j 1 -g 2"
    long = (
        "conv --forw 4 --batchsize 2 --in_channels 8 --in_d 4 --in_h 6 --in_w 6 --out_channels 8 --fil_d 3 "
        "--fil_h 3 --fil_w 3 --pad_d 1 --pad_h 1 --pad_w 1 --conv_stride_d 2 --group_count 2 --spatial_dim 3"
    )
    a, b = miopen(short), miopen(long)
    assert a == b
    assert a.rank == 3 and a.input_size == (4, 6, 6) and a.stride == (2, 1, 1) and a.dtype == "f32"
    assert miopen(format_miopen(a)) == a


def test_miopen_nhwc_layout_maps_to_ck_code_2():
    p = miopen(MIOPEN_2D + " --in_layout NHWC --fil_layout NHWC --out_layout NHWC")
    assert p.layout == "NHWGC/GKYXC/NHWGK"
    assert miopen(format_miopen(p)) == p


@pytest.mark.parametrize(
    "line, match",
    [
        (MIOPEN_2D.replace("-F 4", "-F 1"), "-F: direction '1' is not supported"),
        (MIOPEN_2D.replace("-m conv", "-m trans"), "-m: mode 'trans'"),
        (
            MIOPEN_2D.replace("-g 1", "-g 3"),
            "-c: total channels 64 must be a positive multiple of the group count -g 3",
        ),
        (MIOPEN_2D + " -Z 1", "miopen flag: unknown flag '-Z'"),
        (MIOPEN_2D + " -t", "has none"),
        ("convint8 -F 4", "command: expected one of conv, convfp16, convbfp16"),
        (MIOPEN_2D.replace("-p 1", "-p -1"), "pad_low"),
        (MIOPEN_2D.replace("-H 56", "-H abc"), "--in_h: expected integers"),
    ],
)
def test_bad_miopen_lines_raise_naming_the_flag(line, match):
    with pytest.raises(ValueError, match=match):
        miopen(line)


def test_format_miopen_rejects_what_miopen_cannot_express():
    asym = ConvBwdWeightProblem(1, 2, 3, 4, (8, 8), (3, 3), pad_low=(1, 1), pad_high=(0, 0), layout=4)
    with pytest.raises(ValueError, match="pad_high"):
        format_miopen(asym)
    with pytest.raises(ValueError, match="rank"):
        format_miopen(ConvBwdWeightProblem(1, 2, 3, 4, (8,), (3,), layout=4))


def test_from_line_tells_the_two_formats_apart():
    assert ConvBwdWeightProblem.from_line(MIOPEN_2D) == miopen(MIOPEN_2D)
    assert ConvBwdWeightProblem.from_line("1 1 1 4 4 3 8 1 1 0 0").rank == 1


@st.composite
def problems(draw):
    rank = draw(st.integers(1, 3))
    sizes = lambda lo, hi: st.tuples(*[st.integers(lo, hi)] * rank)  # noqa: E731
    filt, dil = draw(sizes(1, 4)), draw(sizes(1, 3))
    pl, ph = draw(sizes(0, 3)), draw(sizes(0, 3))
    inp = tuple(max(i, d * (f - 1) + 1) for i, d, f in zip(draw(sizes(1, 40)), dil, filt))
    return ConvBwdWeightProblem(
        groups=draw(st.integers(1, 64)), batch=draw(st.integers(1, 64)), in_channels=draw(st.integers(1, 512)),
        out_channels=draw(st.integers(1, 512)), input_size=inp, filter_size=filt, stride=draw(sizes(1, 4)),
        dilation=dil, pad_low=pl, pad_high=ph, dtype=draw(st.sampled_from(["f16", "bf16", "f32"])),
        layout=draw(st.integers(0, 4)),
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(problems(), st.integers(0, 128))
def test_any_problem_round_trips_through_a_whole_ck_line(p, split_k):
    cmd = CkCommand(p, split_k=split_k)
    assert ck(cmd.format()) == cmd
    assert ConvBwdWeightProblem.from_ck(p.to_ck(), dtype=p.dtype, layout=p.layout) == p


@settings(max_examples=200, deadline=None)
@given(problems())
def test_any_symmetric_2d_or_3d_problem_round_trips_through_miopen(p):
    if p.rank == 1 or p.layout_family.ck_code not in (2, 4):
        return
    p = p.with_(pad_high=p.pad_low)
    line = format_miopen(p)
    assert miopen(line) == p and format_miopen(miopen(line)) == line
