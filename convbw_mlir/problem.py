"""The grouped-convolution backward-weight problem: one frozen dataclass.

dW[g, k, f..., c] = sum over n, o... of x[n, g, c, o*stride + f*dilation - pad_low] * dy[n, g, k, o]

optionally followed by an :class:`Epilogue` applied where dW is written (docs/epilogues.md):
``dW = alpha * (x * dy)`` (scale), ``dW = alpha * (x * dy) + beta * D`` (bilinear, D in dW's layout),
or the same with D the caller's output buffer itself (accumulate: ``dW += x * dy`` at alpha = beta = 1).

Everything else in convbw-mlir (the dialect op, the lowering, the reference, the CLIs) is derived from
a :class:`ConvBwdWeightProblem`. Parsing and printing of ckProfiler and MIOpenDriver argument lines live
in :mod:`convbw_mlir.formats`.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from convbw_mlir import formats

__all__ = [
    "DTYPES",
    "EPILOGUES",
    "FP8_DTYPES",
    "FP8_DW_DTYPES",
    "GROUPED_TWIN",
    "INT64_MAX",
    "K_MAJOR",
    "LAYOUTS",
    "ConvBwdWeightProblem",
    "Epilogue",
    "Layout",
    "fold_rank",
    "resolve_layout",
]

#: Element types of x / dy / dw, with their size in bytes. Accumulation is always f32. The two fp8 types
#: (OCP FP8: e4m3 without infinities, e5m2) are input types only (x and dy; docs/explicit-kernels.md "fp8").
DTYPES: dict[str, int] = {"f16": 2, "bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
FP8_DTYPES = ("e4m3", "e5m2")
#: The types dW is written in from fp8 inputs (the sm_90a fp8 GEMM's outputs).
FP8_DW_DTYPES = ("f32", "bf16")
#: The largest finite value of each element type (IEEE half; bfloat16 and float32 share f32's exponent;
#: OCP FP8: e4m3 448, e5m2 57344).
DTYPE_MAX: dict[str, float] = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38,
                               "e4m3": 448.0, "e5m2": 57344.0}  # fmt: skip

#: Largest size and byte count a problem may have: MLIR shapes, IREE's buffer sizes and numpy's are int64.
INT64_MAX = 2**63 - 1

_SPATIAL_IN = "DHW"  # input/output spatial letters, outermost first
_SPATIAL_FILTER = "ZYX"  # filter spatial letters


@dataclass(frozen=True)
class Layout:
    """A layout family: the dimension order of x, dW and dy, spelled for 2-D.

    The 1-D and 3-D members of a family drop or add spatial letters (``NHWGC`` -> ``NWGC`` /
    ``NDHWGC``). ``ck_code`` is the ckProfiler layout argument, ``None`` for the PyTorch forms.
    """

    x: str
    w: str
    y: str
    ck_code: int | None
    grouped: bool  # False: no G dimension, so the problem must have G=1

    @property
    def name(self) -> str:
        return f"{self.x}/{self.w}/{self.y}"

    def spelled(self, rank: int) -> str:
        """The family's name spelled for ``rank`` spatial dimensions (``NDHWGC/GKZYXC/NDHWGK``)."""
        return "/".join(_spell(s, rank) for s in (self.x, self.w, self.y))

    def dims(self, tensor: str, rank: int) -> tuple[str, ...]:
        """Dimension letters of ``tensor`` ("x", "w" or "y") for ``rank`` spatial dimensions."""
        return tuple(_spell(getattr(self, tensor), rank))


def _spell(two_d: str, rank: int) -> str:
    return two_d.replace("HW", _SPATIAL_IN[-rank:]).replace("YX", _SPATIAL_FILTER[-rank:])


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        # ckProfiler's grouped_conv_bwd_weight layout codes 0..4
        # (CK profiler/src/profile_grouped_conv_bwd_weight.cpp, "arg3: tensor layout").
        Layout("GNCHW", "GKCYX", "GNKHW", 0, True),
        Layout("GNHWC", "GKYXC", "GNHWK", 1, True),
        Layout("NHWGC", "GKYXC", "NHWGK", 2, True),
        Layout("NGCHW", "GKYXC", "NGKHW", 3, True),
        Layout("NGCHW", "GKCYX", "NGKHW", 4, True),
        # PyTorch's contiguous and channels-last memory formats, G=1 only.
        Layout("NCHW", "KCYX", "NKHW", None, False),
        Layout("NHWC", "KYXC", "NHWK", None, False),
    )
}
DEFAULT_LAYOUT = "NHWGC/GKYXC/NHWGK"
#: fp8 only, G = 1: x and dy K-major (``x^T [C, N, H, W]``, ``dy^T [K, N, H, W]``: the reduction innermost), the
#: copies an fp8 recipe's quantize step writes beside its casts (8-bit wgmma takes K-major operands only).
#: Not in LAYOUTS, the families every kernel takes: only the fp8 GEMM reads it (docs/explicit-kernels.md).
K_MAJOR = Layout("CNHW", "KYXC", "KNHW", None, False)
#: The grouped family whose bytes each G-less family's are (G = 1 is a unit dimension, inserted in place):
#: PyTorch's contiguous format is layout 4's, channels-last layout 2's (:meth:`ConvBwdWeightProblem.grouped`).
GROUPED_TWIN = {"NCHW/KCYX/NKHW": "NGCHW/GKCYX/NGKHW", "NHWC/KYXC/NHWK": "NHWGC/GKYXC/NHWGK"}
_LAYOUT_ALIASES = {"torch": "NCHW/KCYX/NKHW", "channels_last": "NHWC/KYXC/NHWK", "default": DEFAULT_LAYOUT,
                   "k_major": K_MAJOR.name}  # fmt: skip


_NUMPY_DTYPES = {"f16": "float16", "f32": "float32"}
_ML_DTYPES = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for an element type name; bf16 and the fp8 types are ``ml_dtypes``' (a dependency of
    iree-base-runtime)."""
    if name in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))
    return np.dtype(_NUMPY_DTYPES[name])


def resolve_layout(spec: str | int, rank: int | None = None) -> Layout:
    """Find a layout family by name (any rank's spelling), alias or ckProfiler code.

    Raises:
        ValueError: unknown layout, naming it and listing the known ones.
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        for layout in LAYOUTS.values():
            if layout.ck_code == spec:
                return layout
    elif isinstance(spec, str):
        key = _LAYOUT_ALIASES.get(spec.lower(), spec.upper())
        ranks = (rank,) if rank else (1, 2, 3)
        families = [*LAYOUTS.values(), K_MAJOR]
        for layout in families:
            if key == layout.name or any(key == layout.spelled(r) for r in ranks):
                return layout
        # The input layout alone ("NHWGC", "NCHW") names a family where it is unambiguous.
        by_x = [lay for lay in families if any(key == _spell(lay.x, r) for r in ranks)]
        if len(by_x) == 1:
            return by_x[0]
        if len(by_x) > 1:
            names = " or ".join(f"{lay.name} (ck {lay.ck_code})" for lay in by_x)
            raise ValueError(f"layout: {spec!r} is ambiguous: {names}; give the whole x/w/y triple or the ck code")
    known = ", ".join(f"{n} (ck {lay.ck_code})" if lay.ck_code is not None else n for n, lay in LAYOUTS.items())
    known += f", {K_MAJOR.name} (fp8)"
    raise ValueError(f"layout: unknown layout {spec!r}; known: {known}, aliases {', '.join(_LAYOUT_ALIASES)}")


#: Epilogue kinds: what the kernel does with the f32 result before writing dW (docs/epilogues.md).
EPILOGUES = ("scale", "bilinear", "accumulate")


def _finite(name: str, value: Any) -> float:
    """``value`` as a finite Python float (ints and numpy scalars too; not bools or strings).

    Raises:
        TypeError / ValueError: not a real number, or not finite, naming ``name`` and the value.
    """
    # numbers.Real: Python and numpy ints and floats; bool is one too, and is refused
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return number


@dataclass(frozen=True)
class Epilogue:
    """What happens to the f32 result ``acc = x * dy`` where the kernel writes dW.

    - ``scale``: ``dW = alpha * acc`` (CK's ``Scale``; f16 loss scaling). No D; ``beta`` must be 0.
    - ``bilinear``: ``dW = alpha * acc + beta * D`` (CK's ``Bilinear``), D a tensor in dW's layout
      and shape, of dW's element type or f32 (``d_dtype``, default dW's type).
    - ``accumulate``: the same with D the output's own storage: the result lands in the caller's
      buffer (``dW += acc`` at the defaults alpha = beta = 1); D has dW's type.

    ``d_dtype`` None means "dW's type" and is filled in by the problem that holds the epilogue.

    Raises:
        ValueError / TypeError: an unknown kind, alpha or beta not finite, beta given to ``scale``,
            an unknown ``d_dtype`` (each naming the field and value).
    """

    kind: str
    alpha: float = 1.0
    beta: float = None  # type: ignore[assignment]
    d_dtype: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.kind not in EPILOGUES:
            raise ValueError(f"epilogue.kind: unknown epilogue {self.kind!r}; known: {', '.join(EPILOGUES)}")
        set_(self, "alpha", _finite("epilogue.alpha", self.alpha))
        default_beta = 0.0 if self.kind == "scale" else 1.0
        set_(self, "beta", default_beta if self.beta is None else _finite("epilogue.beta", self.beta))
        for name in ("alpha", "beta"):  # the kernel computes in f32: beyond its range in any output type
            if abs(getattr(self, name)) > DTYPE_MAX["f32"]:
                raise ValueError(f"epilogue.{name}: {getattr(self, name)!r} is beyond f32's range "
                                 f"(largest {DTYPE_MAX['f32']:g})")  # fmt: skip
        if self.kind == "scale":
            if self.beta != 0.0:
                raise ValueError(f"epilogue.beta: a scale epilogue has no D term, got beta={self.beta!r}")
            if self.d_dtype is not None:
                raise ValueError(f"epilogue.d_dtype: a scale epilogue reads no D, got d_dtype={self.d_dtype!r}")
        elif self.d_dtype is not None and self.d_dtype not in DTYPES:
            raise ValueError(f"epilogue.d_dtype: unknown element type {self.d_dtype!r}; known: {', '.join(DTYPES)}")

    @property
    def reads_d(self) -> bool:
        """Whether the kernel takes a third operand D (bilinear, accumulate)."""
        return self.kind != "scale"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "alpha": self.alpha, "beta": self.beta}
        if self.d_dtype is not None:
            data["d_dtype"] = self.d_dtype
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Epilogue:
        """The inverse of :meth:`to_dict`.

        Raises:
            ValueError: not a dictionary, or unknown entries (naming them).
        """
        if not isinstance(data, dict):
            raise TypeError(f"epilogue: expected a dictionary, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"epilogue: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        if "kind" not in data:
            raise ValueError("epilogue: missing field 'kind'")
        return cls(**data)

    @property
    def tag(self) -> str:
        """A short file-name-safe tag: ``scale-a0.5``, ``bilinear-a2-b2-f32``, ``accumulate-a1-b1``."""
        parts = [self.kind, f"a{self.alpha:g}"]
        if self.reads_d:
            parts.append(f"b{self.beta:g}")
        if self.d_dtype is not None and self.kind == "bilinear":
            parts.append(self.d_dtype)
        return "-".join(parts)


def _int(name: str, value: Any, whole: Any = None) -> int:
    """``value`` as a Python int: ints and numpy integers (0-d integer arrays too); not bools or floats.

    Raises:
        TypeError: not an integer, naming ``name`` and ``whole`` (the value the user gave).
    """
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # the integer protocol: numpy integers have it, floats do not
        except TypeError:
            pass
        else:
            if number > INT64_MAX:
                raise ValueError(f"{name}: {number} does not fit in int64 (max {INT64_MAX})")
            return number
    shown = value if whole is None else whole
    raise TypeError(f"{name}: expected ints, got {shown!r}")


def _ints(name: str, value: Any) -> tuple[int, ...] | int:
    """An int (a scalar) or a tuple of ints (a 1-D sequence or integer array), as Python ints.

    Raises:
        TypeError: neither, naming ``name`` and the value.
    """
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {value!r}")
    try:
        return _int(name, value)
    except TypeError:
        pass
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {value!r}") from None
    return tuple(_int(name, v, value) for v in items)


def _as_tuple(name: str, value: Any, rank: int) -> tuple[int, ...]:
    items = _ints(name, value)
    if isinstance(items, int):
        return (items,) * rank
    if len(items) != rank:
        raise ValueError(f"{name}: expected {rank} values (one per spatial dimension), got {value!r}")
    return items


@dataclass(frozen=True)
class ConvBwdWeightProblem:
    """One grouped N-d convolution weight-gradient problem.

    Channel counts are per group (as ckProfiler's K and C). Spatial tuples run outermost first
    (D, H, W); a plain int is broadcast to every spatial dimension.

    Args:
        groups: G, the number of groups.
        batch: N.
        in_channels: C per group.
        out_channels: K per group.
        input_size: spatial sizes of x (1 to 3 values).
        filter_size: spatial sizes of the filter.
        stride, dilation, pad_low, pad_high: per spatial dimension.
        dtype: element type of x (and of dy, unless ``dy_dtype`` says otherwise): "f16", "bf16", "f32", or
            fp8 "e4m3" / "e5m2" (x and dy both fp8, any pair; as fp8 training recipes quantize them).
        dw_dtype: element type of dW; defaults to ``dtype`` (ckProfiler's type 2 is bf16 in, f32 dW), and
            to "f32" for fp8 inputs (which write dW in "f32" or "bf16").
        layout: layout family name, alias or ckProfiler code; see :data:`LAYOUTS`.
        epilogue: an optional :class:`Epilogue` (or its dictionary) applied where dW is written; its
            ``d_dtype`` is filled in (dW's type) and checked against dW's type here. fp8's per-tensor
            scales are a scale epilogue: ``alpha = scale_x * scale_dy`` (dW = alpha * (x * dy) on the codes).
        dy_dtype: element type of dy where it differs from ``dtype`` (fp8 only: e4m3 x, e5m2 dy), else None
            (given equal to ``dtype``, it is stored as None: dy follows x's type, also through ``with_``);
            :attr:`dy_type` is dy's type either way.

    Raises:
        ValueError / TypeError: naming the field and value, for any impossible problem.
    """

    groups: int
    batch: int
    in_channels: int
    out_channels: int
    input_size: tuple[int, ...]
    filter_size: tuple[int, ...]
    stride: tuple[int, ...] = 1  # type: ignore[assignment]
    dilation: tuple[int, ...] = 1  # type: ignore[assignment]
    pad_low: tuple[int, ...] = 0  # type: ignore[assignment]
    pad_high: tuple[int, ...] = 0  # type: ignore[assignment]
    dtype: str = "f16"
    dw_dtype: str = None  # type: ignore[assignment]
    layout: str = DEFAULT_LAYOUT
    epilogue: Epilogue | None = None
    dy_dtype: str = None  # type: ignore[assignment]
    _layout: Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise fields once, here
        for name in ("groups", "batch", "in_channels", "out_channels"):
            try:
                value = _int(name, getattr(self, name))
            except TypeError:
                raise TypeError(f"{name}: expected an int, got {getattr(self, name)!r}") from None
            if value <= 0:
                raise ValueError(f"{name}: must be positive, got {value}")
            set_(self, name, value)
        input_size = _ints("input_size", self.input_size)
        if isinstance(input_size, int):
            input_size = (input_size,)
        rank = len(input_size)
        if rank not in (1, 2, 3):
            raise ValueError(f"input_size: expected 1 to 3 spatial sizes, got {self.input_size!r}")
        for name in ("input_size", "filter_size", "stride", "dilation", "pad_low", "pad_high"):
            set_(self, name, _as_tuple(name, input_size if name == "input_size" else getattr(self, name), rank))
        for name in ("input_size", "filter_size", "stride", "dilation"):
            for v in getattr(self, name):
                if v <= 0:
                    raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("pad_low", "pad_high"):
            if any(v < 0 for v in getattr(self, name)):
                raise ValueError(f"{name}: pads must be non-negative, got {getattr(self, name)}")
        self._check_dtypes()
        spec = self.layout
        if not isinstance(spec, str) and not isinstance(spec, bool):
            try:
                spec = operator.index(spec)  # a ckProfiler code given as a numpy integer
            except TypeError:
                pass
        layout = resolve_layout(spec, rank)
        if not layout.grouped and self.groups != 1:
            raise ValueError(
                f"layout: {layout.name} has no group dimension and needs groups=1, got groups={self.groups}"
            )
        if layout == K_MAJOR and not self.is_fp8:
            raise ValueError(f"layout: {layout.name} is the K-major layout of fp8 inputs (what an fp8 recipe's "
                             f"quantize step writes); dtype {self.dtype} takes the others")  # fmt: skip
        set_(self, "layout", layout.name)
        set_(self, "_layout", layout)
        for i in range(rank):
            span = self.dilation[i] * (self.filter_size[i] - 1) + 1
            padded = self.input_size[i] + self.pad_low[i] + self.pad_high[i]
            if span > padded:
                raise ValueError(
                    f"filter_size: filter_size[{i}]={self.filter_size[i]} with dilation {self.dilation[i]} "
                    f"spans {span}, larger than the padded input {padded} (input_size[{i}]={self.input_size[i]}); "
                    "the output would be empty"
                )
        self._check_int64_sizes()
        self._check_epilogue()

    def _check_dtypes(self) -> None:
        """Fill in dy's and dW's types; fp8 (x and dy e4m3 / e5m2) writes dW in f32 or bf16, and only fp8
        gives dy a type of its own."""
        set_ = object.__setattr__
        for name in ("dtype", "dy_dtype", "dw_dtype"):
            value = getattr(self, name)
            if value is None and name != "dtype":
                value = self.dtype if name == "dy_dtype" or not self.is_fp8 else "f32"
                set_(self, name, None if name == "dy_dtype" else value)
            if not isinstance(value, str) or value not in DTYPES:
                raise ValueError(f"{name}: unknown element type {value!r}; known: {', '.join(DTYPES)}")
            if name == "dy_dtype" and (value in FP8_DTYPES) != self.is_fp8:
                raise ValueError(f"dy_dtype: {value!r} with dtype {self.dtype!r}: x and dy are both fp8 "
                                 f"({' or '.join(FP8_DTYPES)}) or neither")  # fmt: skip
            if name == "dy_dtype" and not self.is_fp8 and value != self.dtype:
                raise ValueError(f"dy_dtype: {value!r} differs from dtype {self.dtype!r}: only fp8 inputs "
                                 "(e4m3 x, e5m2 dy) take two types")  # fmt: skip
            if name == "dy_dtype" and value == self.dtype:
                set_(self, name, None)
        if self.dw_dtype in FP8_DTYPES or (self.is_fp8 and self.dw_dtype not in FP8_DW_DTYPES):
            raise ValueError(f"dw_dtype: {self.dw_dtype!r} (from {self.dtype} inputs dW is written in "
                             f"{' or '.join(FP8_DW_DTYPES if self.is_fp8 else ('f16', 'bf16', 'f32'))})")  # fmt: skip

    @property
    def dy_type(self) -> str:
        """dy's element type: :attr:`dy_dtype` where given, else ``dtype``."""
        return self.dy_dtype or self.dtype

    @property
    def is_fp8(self) -> bool:
        """Whether x (and so dy) is fp8 (e4m3 / e5m2)."""
        return self.dtype in FP8_DTYPES

    def _check_epilogue(self) -> None:
        """Normalise the epilogue (a dictionary becomes an :class:`Epilogue`; D's type defaults to dW's)."""
        ep = self.epilogue
        if ep is None:
            return
        if isinstance(ep, dict):
            ep = Epilogue.from_dict(ep)
        if not isinstance(ep, Epilogue):
            raise TypeError(f"epilogue: expected an Epilogue, a dictionary or None, got {ep!r}")
        top = DTYPE_MAX[self.dw_dtype]
        for name in ("alpha", "beta"):  # beyond the output type's range every nonzero result overflows
            if abs(getattr(ep, name)) > top:
                raise ValueError(f"epilogue.{name}: {getattr(ep, name)!r} is beyond the range of dW's type "
                                 f"{self.dw_dtype} (largest {top:g})")  # fmt: skip
        if ep.reads_d:
            d_dtype = ep.d_dtype or self.dw_dtype
            allowed = (self.dw_dtype,) if ep.kind == "accumulate" else (self.dw_dtype, "f32")
            if d_dtype not in allowed:
                what = "the output's own type" if ep.kind == "accumulate" else "dW's type or f32"
                raise ValueError(
                    f"epilogue.d_dtype: {ep.kind} takes D of {what} ({' or '.join(dict.fromkeys(allowed))}), "
                    f"got {d_dtype}"
                )
            if d_dtype != ep.d_dtype:
                ep = replace(ep, d_dtype=d_dtype)
        object.__setattr__(self, "epilogue", ep)

    @property
    def plain(self) -> ConvBwdWeightProblem:
        """This problem without its epilogue (what the contraction itself computes)."""
        return self if self.epilogue is None else replace(self, epilogue=None)

    def _check_int64_sizes(self) -> None:
        """Refuse a problem whose reduction, or some tensor's element or byte count, overflows int64."""

        def refuse(what: str, formula: str, factors: list[int], dtype: str | None = None) -> None:
            count = math.prod(factors)
            nbytes = count * DTYPES[dtype] if dtype else count
            if nbytes > INT64_MAX:
                in_bytes = f" ({nbytes} bytes in {dtype})" if dtype else ""
                raise ValueError(
                    f"{what}: {formula} = {' * '.join(map(str, factors))} = {count} elements{in_bytes}, "
                    f"more than int64 holds ({INT64_MAX})"
                )

        padded = [i + pl + ph for i, pl, ph in zip(self.input_size, self.pad_low, self.pad_high)]
        n, g, c, k = self.batch, self.groups, self.in_channels, self.out_channels
        refuse("reduction", "batch * output_size", [n, *self.output_size])
        refuse("x", "batch * input_size * groups * in_channels", [n, *self.input_size, g, c], self.dtype)
        # the lowering materialises x with its pads (the gather generic) on every target
        refuse("x padded", "batch * (input_size + pads) * groups * in_channels", [n, *padded, g, c], self.dtype)
        refuse("dy", "batch * output_size * groups * out_channels", [n, *self.output_size, g, k], self.dy_type)
        refuse("dw", "groups * out_channels * filter_size * in_channels", [g, k, *self.filter_size, c], self.dw_dtype)

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Number of spatial dimensions (1, 2 or 3)."""
        return len(self.input_size)

    @property
    def output_size(self) -> tuple[int, ...]:
        return tuple(
            (i + pl + ph - d * (f - 1) - 1) // s + 1
            for i, f, s, d, pl, ph in zip(
                self.input_size, self.filter_size, self.stride, self.dilation, self.pad_low, self.pad_high
            )
        )

    @property
    def layout_family(self) -> Layout:
        return self._layout

    def dims(self, tensor: str) -> tuple[str, ...]:
        """Dimension letters of "x", "dy" or "dw" in this problem's layout (e.g. ``N H W G C``), or of
        "acc", the f32 accumulator every lowering uses: ``G K <filter> C`` (filter channel innermost;
        no G in a G-less layout)."""
        if tensor == "acc":
            w = self._layout.dims("w", self.rank)
            return (*(("G",) if "G" in w else ()), "K", *(d for d in w if d in _SPATIAL_FILTER), "C")
        return self._layout.dims({"x": "x", "dy": "y", "dw": "w"}[tensor], self.rank)

    def _size(self, tensor: str, letter: str) -> int:
        if letter in "NGCK":
            return {"N": self.batch, "G": self.groups, "C": self.in_channels, "K": self.out_channels}[letter]
        if letter in _SPATIAL_FILTER:
            return self.filter_size[_SPATIAL_FILTER[-self.rank :].index(letter)]
        spatial = self.input_size if tensor == "x" else self.output_size  # dy (acc/dw have no DHW)
        return spatial[_SPATIAL_IN[-self.rank :].index(letter)]

    def shape(self, tensor: str) -> tuple[int, ...]:
        """Shape of "x", "dy" or "dw" in this problem's layout."""
        return tuple(self._size(tensor, d) for d in self.dims(tensor))

    @property
    def x_shape(self) -> tuple[int, ...]:
        return self.shape("x")

    @property
    def dy_shape(self) -> tuple[int, ...]:
        return self.shape("dy")

    @property
    def dw_shape(self) -> tuple[int, ...]:
        return self.shape("dw")

    @property
    def gemm(self) -> tuple[int, int, int, int]:
        """The implicit-GEMM view ``(G, M, N, K)``: M = K, N = C * prod(filter), K = N * prod(output)."""
        return (
            self.groups,
            self.out_channels,
            self.in_channels * math.prod(self.filter_size),
            self.batch * math.prod(self.output_size),
        )

    @property
    def flops(self) -> int:
        g, m, n, k = self.gemm
        return 2 * g * m * n * k

    @property
    def min_bytes(self) -> int:
        """Bytes that must move at least: read x and dy once, write dW once (and read D once, if any)."""
        x = math.prod(self.x_shape) * DTYPES[self.dtype]
        dy = math.prod(self.dy_shape) * DTYPES[self.dy_type]
        d = 0
        if self.epilogue is not None and self.epilogue.reads_d:
            d = math.prod(self.dw_shape) * DTYPES[self.epilogue.d_dtype]
        return x + dy + d + math.prod(self.dw_shape) * DTYPES[self.dw_dtype]

    @property
    def is_depthwise(self) -> bool:
        return self.groups > 1 and self.in_channels == 1 and self.out_channels == 1

    @property
    def name(self) -> str:
        """A short identifier, usable as a file name: ``2d_g1_n4_c64_k64_f3x3_i56x56_s1x1_d1x1_p1x1_1x1_f16``."""

        def j(t: tuple[int, ...]) -> str:
            return "x".join(map(str, t))

        inputs = self.dtype if self.dy_dtype is None else f"{self.dtype}x{self.dy_dtype}"
        types = inputs if self.dw_dtype == self.dtype else f"{inputs}-{self.dw_dtype}"
        code = self._layout.ck_code
        lay = f"l{code}" if code is not None else self._layout.x.lower()
        epilogue = f"_{self.epilogue.tag}" if self.epilogue is not None else ""
        return (
            f"{self.rank}d_g{self.groups}_n{self.batch}_c{self.in_channels}_k{self.out_channels}"
            f"_f{j(self.filter_size)}_i{j(self.input_size)}_s{j(self.stride)}_d{j(self.dilation)}"
            f"_p{j(self.pad_low)}_{j(self.pad_high)}_{types}_{lay}{epilogue}"
        )

    def grouped(self) -> ConvBwdWeightProblem:
        """This problem in the grouped layout whose bytes its G-less layout's are (:data:`GROUPED_TWIN`: x, dy,
        dW and D each gain a unit G, nothing moves); itself in a grouped layout (or the fp8-only K-major one)."""
        twin = GROUPED_TWIN.get(self.layout)
        return self if twin is None else self.with_(layout=twin)

    def with_(self, **changes: Any) -> ConvBwdWeightProblem:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data; ``epilogue`` and ``dy_dtype`` appear only where there is one (so other problems' dicts
        and keys are what they were before either existed)."""
        data = {
            f.name: getattr(self, f.name) for f in fields(self) if f.init and f.name not in ("epilogue", "dy_dtype")
        }
        if self.dy_dtype is not None:
            data["dy_dtype"] = self.dy_dtype
        if self.epilogue is not None:
            data["epilogue"] = self.epilogue.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConvBwdWeightProblem:
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"problem: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    # The lines' codec is formats.py; these are the conveniences people look for here.
    @classmethod
    def from_ck(cls, line: str | list[str], **defaults: Any) -> ConvBwdWeightProblem:
        """Parse a ckProfiler ``grouped_conv_bwd_weight`` line (whole, or the problem part alone)."""
        return cls(**formats.parse_ck(line, **defaults).problem)

    @classmethod
    def from_miopen(cls, line: str | list[str]) -> ConvBwdWeightProblem:
        """Parse a MIOpenDriver ``conv``/``convfp16``/``convbfp16`` backward-weight line."""
        return cls(**formats.parse_miopen(line))

    @classmethod
    def from_line(cls, line: str | list[str]) -> ConvBwdWeightProblem:
        """Parse either kind of line, telling them apart by the first word."""
        return cls.from_miopen(line) if formats.is_miopen_line(line) else cls.from_ck(line)

    def to_ck(self, full: bool = False) -> str:
        cmd = formats.CkCommand(self)
        return cmd.format() if full else cmd.format_problem()

    def to_miopen(self) -> str:
        return formats.format_miopen(self)


def fold_rank(problem: ConvBwdWeightProblem) -> tuple[ConvBwdWeightProblem | None, str]:
    """The 2-D problem a 3-D layout-2 (NDHWGC/GKZYXC/NDHWGK) one is by reshapes alone, and how; else None and why
    (docs/decisions.md#rank-fold). Two folds, the same bytes in every tensor:

    * ``depth``: filter depth 1, depth stride 1, no depth padding: the output has x's depth and each depth slice is
      a 2-D problem, so D joins the batch: x [N*D, H, W, G, C], dy [N*D, Ho, Wo, G, K], dW [G, K, kh, kw, C];
    * ``plane``: filter 1 x 1 in H and W, stride 1 and no padding there: H and W are one axis of H*W positions:
      x [N, D, H*W, G, C], dy [N, Do, H*W, G, K], a (kd, 1) filter, dW [G, K, kd, 1, C].

    A 1x1x1 is a GEMM already (``plan.as_gemm``); other ranks and layouts, and fp8, are left as they are.
    """
    if problem.rank != 3:
        return None, f"rank {problem.rank} (the fold takes 3-D problems)"
    if problem.is_fp8:
        return None, f"dtype {problem.dtype} (the fp8 GEMM reads x and dy as they lie)"
    if problem.grouped().layout != DEFAULT_LAYOUT:
        return None, f"layout {problem.layout} (the fold reshapes layout 2, {DEFAULT_LAYOUT}, alone)"
    f, s, lo, hi = problem.filter_size, problem.stride, problem.pad_low, problem.pad_high
    if f == (1, 1, 1):
        return None, "filter 1x1x1 (a GEMM already)"
    if f[0] == 1 and s[0] == 1 and lo[0] == hi[0] == 0:
        two_d = dict(batch=problem.batch * problem.input_size[0], input_size=problem.input_size[1:],
                     filter_size=f[1:], stride=s[1:], dilation=problem.dilation[1:], pad_low=lo[1:],
                     pad_high=hi[1:])  # fmt: skip
        return problem.with_(layout=DEFAULT_LAYOUT, **two_d), "depth"
    if f[1:] == (1, 1) and s[1:] == (1, 1) and not any(lo[1:] + hi[1:]):
        d, h, w = problem.input_size
        two_d = dict(input_size=(d, h * w), filter_size=(f[0], 1), stride=(s[0], 1),
                     dilation=(problem.dilation[0], 1), pad_low=(lo[0], 0), pad_high=(hi[0], 0))  # fmt: skip
        return problem.with_(layout=DEFAULT_LAYOUT, **two_d), "plane"
    return None, (f"filter {'x'.join(map(str, f))}, stride {'x'.join(map(str, s))}, padding "
                  f"{'x'.join(map(str, lo))}/{'x'.join(map(str, hi))} (the fold needs depth 1, depth stride 1 and no "
                  "depth padding, or 1x1 in H and W with stride 1 and no padding there)")  # fmt: skip
