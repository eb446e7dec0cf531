"""ckProfiler and MIOpenDriver argument lines <-> a problem's fields.

The codec under :class:`convbw_mlir.problem.ConvBwdWeightProblem`'s ``from_ck``, ``from_miopen``,
``from_line``, ``to_ck`` and ``to_miopen``: parsers return the problem's constructor arguments, printers read
a problem's attributes, so this module needs nothing from ``problem`` (which builds on it). Both printers
write the canonical form of a line; parsing a printed line gives the same problem back (and printing it
again gives the same line).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["CkCommand", "format_miopen", "is_miopen_line", "parse_ck", "parse_miopen"]

# ckProfiler grouped_conv_bwd_weight "arg2: data type" (CK profiler/src/profile_grouped_conv_bwd_weight.cpp).
CK_DTYPES: dict[int, tuple[str, str]] = {0: ("f32", "f32"), 1: ("f16", "f16"), 2: ("bf16", "f32"), 5: ("bf16", "bf16")}
_CK_UNSUPPORTED = {3: "fp16 in/out with bf8/fp8 compute", 4: "fp8", 6: "bf16/fp32 mixed with fp8 compute", 7: "int8"}
CK_OP = "grouped_conv_bwd_weight"


def _ints(field: str, words: list[str]) -> list[int]:
    try:
        return [int(w) for w in words]
    except ValueError:
        raise ValueError(f"{field}: expected integers, got {' '.join(words)!r}") from None


def _words(line: str | list[str]) -> list[str]:
    return shlex.split(line) if isinstance(line, str) else [str(w) for w in line]


@dataclass(frozen=True)
class CkCommand:
    """A whole ckProfiler ``grouped_conv_bwd_weight`` command: the problem (its constructor arguments when
    parsed, the problem itself when printed) and the profiler's switches."""

    problem: Any  # the problem's fields (a dict) or a ConvBwdWeightProblem
    verify: int = 1
    init: int = 1
    log: int = 0
    time: int = 1
    split_k: int = 0  # 0: ckProfiler picks k_batch itself

    @property
    def dtype_code(self) -> int:
        pair = (self.problem.dtype, self.problem.dw_dtype)
        for code, types in CK_DTYPES.items():
            if types == pair:
                return code
        raise ValueError(f"dtype: x/dy {pair[0]} with dW {pair[1]} has no ckProfiler data type code")

    def format_problem(self) -> str:
        p = self.problem
        if p.layout_family.ck_code is None:
            raise ValueError(f"layout: {p.layout} has no ckProfiler layout code (codes 0-4 are grouped layouts)")
        nums = [p.rank, p.groups, p.batch, p.out_channels, p.in_channels]
        for t in (p.filter_size, p.input_size, p.stride, p.dilation, p.pad_low, p.pad_high):
            nums += list(t)
        return " ".join(map(str, nums))

    def format(self) -> str:
        lead = [CK_OP, self.dtype_code, self.problem.layout_family.ck_code, self.verify, self.init, self.log, self.time]
        return f"{' '.join(map(str, lead))} {self.format_problem()} {self.split_k}"


def parse_ck(line: str | list[str], dtype: str = "f16", layout: str | int = 2) -> CkCommand:
    """The problem's fields (``.problem``, a dict) and switches of ckProfiler arguments:
    ``[ckProfiler] grouped_conv_bwd_weight DT LAYOUT VERIFY INIT LOG TIME
    <problem> SPLIT_K`` or the problem part alone ``NDim G N K C <filter> <input> <strides> <dilations>
    <left pads> <right pads>`` (then ``dtype`` and ``layout`` apply).

    Raises:
        ValueError: a malformed line, an unsupported data type or layout code, an impossible problem.
    """
    words = _words(line)
    if words and words[0].endswith("ckProfiler"):
        words = words[1:]
    switches: dict[str, int] = {}
    if words and not words[0].lstrip("-").isdigit():
        if words[0] != CK_OP:
            raise ValueError(f"operation: expected {CK_OP!r}, got {words[0]!r}")
        if len(words) < 8:
            raise ValueError(f"ck line: expected 7 leading arguments then the problem, got {' '.join(words)!r}")
        code, lay, verify, init, log, time = _ints("ck switches", words[1:7])
        if code not in CK_DTYPES:
            what = _CK_UNSUPPORTED.get(code, "unknown")
            known = ", ".join(f"{c} ({a}/{b})" for c, (a, b) in CK_DTYPES.items())
            raise ValueError(f"data type: ckProfiler code {code} ({what}) is not supported; supported: {known}")
        dtype, dw_dtype = CK_DTYPES[code]
        layout = lay
        switches = dict(verify=verify, init=init, log=log, time=time)
        words = words[7:]
    else:
        dw_dtype = dtype
    if not words:
        raise ValueError("ck line: the problem arguments are missing")
    ndim = _ints("NDim", words[:1])[0]
    if ndim not in (1, 2, 3):
        raise ValueError(f"NDim: expected 1, 2 or 3, got {ndim}")
    expected = 5 + 6 * ndim
    if len(words) not in (expected, expected + 1) or (len(words) == expected + 1 and not switches):
        raise ValueError(
            f"ck line: NDim={ndim} takes {expected} problem arguments (NDim G N K C, then 6 groups of {ndim})"
            f"{' and split-K' if switches else ''}, got {len(words)}: {' '.join(words)!r}"
        )
    nums = _ints("ck problem", words)
    g, n, k, c = nums[1:5]
    spatial = [tuple(nums[5 + i * ndim : 5 + (i + 1) * ndim]) for i in range(6)]
    problem = dict(
        groups=g,
        batch=n,
        in_channels=c,
        out_channels=k,
        filter_size=spatial[0],
        input_size=spatial[1],
        stride=spatial[2],
        dilation=spatial[3],
        pad_low=spatial[4],
        pad_high=spatial[5],
        dtype=dtype,
        dw_dtype=dw_dtype,
        layout=layout,
    )
    if switches and len(words) == expected + 1:
        switches["split_k"] = nums[-1]
        if switches["split_k"] < 0:
            raise ValueError(f"split_k: must be 0 (auto) or positive, got {switches['split_k']}")
    return CkCommand(problem, **switches)


# MIOpenDriver conv flags (MIOpen driver/conv_driver.hpp AddCmdLineArgs): short form -> long form.
_MIOPEN_FLAGS = {
    "-n": "--batchsize", "-c": "--in_channels", "-H": "--in_h", "-W": "--in_w", "-!": "--in_d",
    "-k": "--out_channels", "-y": "--fil_h", "-x": "--fil_w", "-@": "--fil_d",
    "-p": "--pad_h", "-q": "--pad_w", "-$": "--pad_d",
    "-u": "--conv_stride_h", "-v": "--conv_stride_w", "-#": "--conv_stride_d",
    "-l": "--dilation_h", "-j": "--dilation_w", "-^": "--dilation_d",
    "-g": "--group_count", "-F": "--forw", "-m": "--mode", "-_": "--spatial_dim",
    "-t": "--time", "-V": "--verify", "-I": "--in_layout", "-f": "--fil_layout", "-O": "--out_layout",
}  # fmt: skip
# MIOpenDriver's defaults for flags left out (conv_driver.hpp).
_MIOPEN_DEFAULTS = {
    "--batchsize": 100, "--in_channels": 3, "--in_h": 32, "--in_w": 32, "--in_d": 32,
    "--out_channels": 32, "--fil_h": 3, "--fil_w": 3, "--fil_d": 3,
    "--pad_h": 0, "--pad_w": 0, "--pad_d": 0, "--conv_stride_h": 1, "--conv_stride_w": 1, "--conv_stride_d": 1,
    "--dilation_h": 1, "--dilation_w": 1, "--dilation_d": 1, "--group_count": 1,
}  # fmt: skip
_MIOPEN_DTYPES = {"conv": "f32", "convfp16": "f16", "convbfp16": "bf16"}
_IGNORED = {"--time", "--verify"}
# MIOpen's NCHW grouped tensors are x [N, G*C, H, W], w [G*K, C, Y, X], y [N, G*K, H, W]: ck code 4.
# NHWC ones are x [N, H, W, G*C], w [G*K, Y, X, C], y [N, H, W, G*K]: ck code 2.
_MIOPEN_LAYOUTS = {"NCHW": 4, "NCDHW": 4, "NHWC": 2, "NDHWC": 2}


def parse_miopen(line: str | list[str]) -> dict[str, Any]:
    """The problem's fields of a MIOpenDriver backward-weight line,
    e.g. ``convfp16 -F 4 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3
    -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -m conv -g 1``. C and K are totals there; G must divide both.

    Raises:
        ValueError: unknown command or flag, a direction other than -F 4, a mode other than conv, ...
    """
    words = _words(line)
    if words and words[0].endswith("MIOpenDriver"):
        words = words[1:]
    if not words or words[0] not in _MIOPEN_DTYPES:
        got = words[0] if words else ""
        raise ValueError(f"command: expected one of {', '.join(_MIOPEN_DTYPES)}, got {got!r}")
    dtype = _MIOPEN_DTYPES[words[0]]
    values: dict[str, str] = {}
    rest = words[1:]
    if len(rest) % 2:
        raise ValueError(f"miopen line: every flag takes one value; {rest[-1]!r} has none")
    for flag, value in zip(rest[::2], rest[1::2]):
        long = _MIOPEN_FLAGS.get(flag, flag)
        if long not in _MIOPEN_FLAGS.values():
            raise ValueError(f"miopen flag: unknown flag {flag!r}; known: {' '.join(sorted(_MIOPEN_FLAGS))}")
        values[long] = value
    forw = values.pop("--forw", "4")
    if forw != "4":
        raise ValueError(f"-F: direction {forw!r} is not supported; convbw-mlir is backward-weight only (-F 4)")
    mode = values.pop("--mode", "conv")
    if mode != "conv":
        raise ValueError(f"-m: mode {mode!r} is not supported; only 'conv' (transposed convolution is not)")
    for key in _IGNORED:
        values.pop(key, None)
    layouts = {values.pop(k, "NCHW").upper() for k in ("--in_layout", "--fil_layout", "--out_layout")}
    if len(layouts) != 1 or not layouts <= set(_MIOPEN_LAYOUTS):
        raise ValueError(f"layout: in/fil/out layouts must agree and be NCHW or NHWC, got {sorted(layouts)}")
    nums = dict(_MIOPEN_DEFAULTS)
    for key, value in values.items():
        nums[key] = _ints(key, [value])[0]
    three_d = any(k in values for k in ("--in_d", "--fil_d", "--pad_d", "--conv_stride_d", "--dilation_d"))
    spatial_dim = nums.pop("--spatial_dim", 3 if three_d else 2)
    if spatial_dim not in (2, 3):
        raise ValueError(f"--spatial_dim: expected 2 or 3, got {spatial_dim}")
    axes = ("d", "h", "w") if spatial_dim == 3 else ("h", "w")
    g = nums["--group_count"]
    c_total, k_total = nums["--in_channels"], nums["--out_channels"]
    if g <= 0:
        raise ValueError(f"-g: group count must be positive, got {g}")
    for flag, total in (("-c", c_total), ("-k", k_total)):
        if total <= 0 or total % g:
            raise ValueError(f"{flag}: total channels {total} must be a positive multiple of the group count -g {g}")

    def per_axis(prefix: str) -> tuple[int, ...]:
        return tuple(nums[f"--{prefix}_{a}"] for a in axes)

    pads = per_axis("pad")
    return dict(
        groups=g,
        batch=nums["--batchsize"],
        in_channels=c_total // g,
        out_channels=k_total // g,
        input_size=per_axis("in"),
        filter_size=per_axis("fil"),
        stride=per_axis("conv_stride"),
        dilation=per_axis("dilation"),
        pad_low=pads,
        pad_high=pads,
        dtype=dtype,
        layout=_MIOPEN_LAYOUTS[layouts.pop()],
    )


def format_miopen(p: ConvBwdWeightProblem) -> str:
    """Print ``p`` as a MIOpenDriver line. MIOpen pads symmetrically and has no 1-D form.

    Raises:
        ValueError: a problem MIOpenDriver cannot express (1-D, asymmetric pads, f32 dW with bf16 in, a
            layout other than NCHW/GKCYX or NHWC/GKYXC).
    """
    if p.rank == 1:
        raise ValueError("rank: MIOpenDriver has no 1-D convolution")
    if p.pad_low != p.pad_high:
        raise ValueError(f"pad_high: MIOpenDriver pads symmetrically; pad_low {p.pad_low} != pad_high {p.pad_high}")
    if p.dw_dtype != p.dtype:
        raise ValueError(f"dw_dtype: MIOpenDriver has no {p.dtype} in / {p.dw_dtype} dW type")
    code = p.layout_family.ck_code
    if code not in (2, 4):
        raise ValueError(f"layout: {p.layout} is not a MIOpen layout (NCHW = ck code 4, NHWC = ck code 2)")
    cmd = {v: k for k, v in _MIOPEN_DTYPES.items()}[p.dtype]
    axes = ("d", "h", "w") if p.rank == 3 else ("h", "w")
    short = {v: k for k, v in _MIOPEN_FLAGS.items()}
    parts = [cmd, "-F", "4", "-n", str(p.batch), "-c", str(p.in_channels * p.groups)]
    for prefix, values in (("in", p.input_size),):
        parts += [x for a, v in zip(axes, values) for x in (short[f"--{prefix}_{a}"], str(v))]
    parts += ["-k", str(p.out_channels * p.groups)]
    for prefix, values in (
        ("fil", p.filter_size),
        ("pad", p.pad_low),
        ("conv_stride", p.stride),
        ("dilation", p.dilation),
    ):
        parts += [x for a, v in zip(axes, values) for x in (short[f"--{prefix}_{a}"], str(v))]
    parts += ["-m", "conv", "-g", str(p.groups)]
    if code == 2:
        parts += ["--in_layout", "NHWC", "--fil_layout", "NHWC", "--out_layout", "NHWC"]
    if p.rank == 3:
        parts += ["-_", "3"]
    return shlex.join(parts)


def is_miopen_line(line: str | list[str]) -> bool:
    """Whether ``line`` is a MIOpenDriver line (else a ckProfiler one), by its first word."""
    words = _words(line)
    return bool(words) and (words[0] in _MIOPEN_DTYPES or words[0].endswith("MIOpenDriver"))
