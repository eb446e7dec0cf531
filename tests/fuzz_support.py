"""Helpers of the random-problem fuzz test (tests/test_fuzz.py): strategies, an independent oracle, a
crash-proof runner, and the outcome bookkeeping.

The oracle is a direct sum over the definition (loops over filter taps and output positions, numpy over
images and channels) and takes nothing from :mod:`convbw_mlir.reference`: it moves tensors between the
problem's layout and its own order with ``np.einsum`` subscripts spelled from the layout letters.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from convbw_mlir.problem import LAYOUTS, ConvBwdWeightProblem, Epilogue
from convbw_mlir.targets import TARGETS

__all__ = [
    "Case",
    "FuzzStats",
    "IsolatedRunner",
    "FIXED_FAILURES",
    "KNOWN_FAILURES",
    "KnownFailure",
    "cases",
    "check_case",
    "known_failure",
    "make_inputs",
    "max_error",
    "needs_own_child",
    "oracle_dw",
    "repro",
    "tolerance",
]

TYPES = ("f16", "bf16", "f32")
K_BATCHES = (1, 2, 3, 7, "rows", "auto")
_NP_TYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}
# Unit roundoff per type; the same numbers as convbw_mlir.reference._EPS (IEEE / bfloat16 definitions).
_EPS = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24}
# Upper bound of input extent per spatial dimension, by rank: keeps the oracle's Python loops and each
# host compile small (a 3-D problem has up to 27 taps).
_MAX_INPUT = {1: 12, 2: 8, 3: 5}


# -- the oracle --------------------------------------------------------------------------------------
def _letters(problem: ConvBwdWeightProblem, tensor: str) -> str:
    return "".join(problem.dims(tensor))


def oracle_dw(problem: ConvBwdWeightProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW in float64 and in the problem's dW layout, summed straight from the definition.

    dW[g, k, c, f...] = sum over n, o... of x[n, g, c, o * stride + f * dilation - pad_low] * dy[n, g, k, o]
    where the x index lies inside the input (padding reads zero).
    """
    p = problem
    sp_in, sp_f = "DHW"[3 - p.rank :], "ZYX"[3 - p.rank :]
    xs, ys, ws = _letters(p, "x"), _letters(p, "dy"), _letters(p, "dw")
    x64, dy64 = np.asarray(x).astype(np.float64), np.asarray(dy).astype(np.float64)
    if "G" not in xs:  # PyTorch layouts: a leading G of 1
        xs, ys, ws, x64, dy64 = "G" + xs, "G" + ys, "G" + ws, x64[None], dy64[None]
    xg = np.einsum(f"{xs}->GNC{sp_in}", x64)  # [G, N, C, in...]
    dyg = np.einsum(f"{ys}->GNK{sp_in}", dy64)  # [G, N, K, out...]
    dw = np.zeros((p.groups, p.out_channels, p.in_channels, *p.filter_size))
    for tap in itertools.product(*(range(f) for f in p.filter_size)):
        for out in itertools.product(*(range(o) for o in p.output_size)):
            pos = [o * s + t * d - lo for o, s, t, d, lo in zip(out, p.stride, tap, p.dilation, p.pad_low)]
            if all(0 <= i < n for i, n in zip(pos, p.input_size)):
                dw[(..., *tap)] += np.einsum("gnk,gnc->gkc", dyg[(..., *out)], xg[(..., *pos)])
    dw = np.einsum(f"GKC{sp_f}->{ws}", dw)
    return dw[0] if ws != "".join(p.dims("dw")) else dw


def tolerance(problem: ConvBwdWeightProblem) -> float:
    """Relative tolerance: dW rounded once to its type, plus f32 accumulation over L = N * prod(output).

    The formula of :func:`convbw_mlir.reference.tolerance` (2 eps(dW) + 8 sqrt(L) eps(f32)), restated here.
    """
    length = problem.batch * math.prod(problem.output_size)
    return 2 * _EPS[problem.dw_dtype] + 8 * math.sqrt(length) * _EPS["f32"]


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest ``|got - want| / (|want| + rms(want))``: entries near zero are judged against the typical size."""
    got = np.asarray(got).astype(np.float64)
    if got.shape != want.shape:
        return math.inf
    if not np.all(np.isfinite(got)):
        return math.inf
    scale = float(np.sqrt(np.mean(want**2))) or 1.0
    return float((np.abs(got - want) / (np.abs(want) + scale)).max()) if want.size else 0.0


def make_inputs(problem: ConvBwdWeightProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit-normal x and dy in the problem's layout and element type."""
    rng = np.random.default_rng(seed)
    dt = _NP_TYPES[problem.dtype]
    x = rng.standard_normal(problem.x_shape).astype(dt)
    dy = rng.standard_normal(problem.dy_shape).astype(dt)
    return x, dy


# -- the child process that compiles and runs ------------------------------------------------------
def _run_op(op: Any, x: np.ndarray, dy: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    """``op`` run on x and dy, with the epilogue's D (for accumulate: the output's own storage)."""
    ep = op.problem.epilogue
    if ep is not None and ep.kind == "accumulate":
        return op.run(x, dy, out=d.copy())
    return op.run(x, dy, d=d) if d is not None else op.run(x, dy)


def _serve(conn: Any) -> None:
    """Child loop: answer ("run", problem, options, x, dy[, compiles[, d]]), ("variant", problem, form, x, dy, d),
    ("compile", problem, form, target) and ("refuse", problem, options)."""
    from unittest import mock

    import convbw_mlir

    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        kind = request[0]
        if kind == "crash":  # the runner's own test: a segfault must be recorded, not kill the run
            import ctypes

            ctypes.string_at(0)
        try:
            if kind == "run":
                _, problem, options, x, dy, *more = request
                compiles = more[0] if more else 1
                d = more[1] if len(more) > 1 else None
                t0 = time.perf_counter()
                for _ in range(compiles):  # compiles of the same problem in this process
                    op = convbw_mlir.compile_op(problem, "host", **options)
                t1 = time.perf_counter()
                dw = _run_op(op, x, dy, d)
                conn.send({"status": "ok", "dw": dw, "compile_s": t1 - t0, "run_s": time.perf_counter() - t1})
            elif kind in ("variant", "compile"):  # one of IREE's own forms, compiled as the tuner compiles it
                from convbw_mlir.dispatch.build import compile_variant
                from convbw_mlir.dispatch.variants import Variant

                if kind == "compile":  # for any target, not run
                    _, problem, form, target = request
                    compile_variant(problem, target, Variant(form))
                    conn.send({"status": "ok"})
                    continue
                _, problem, form, x, dy, d = request
                t0 = time.perf_counter()
                op = compile_variant(problem, "host", Variant(form))
                t1 = time.perf_counter()
                dw = _run_op(op, x, dy, d)
                conn.send({"status": "ok", "dw": dw, "compile_s": t1 - t0, "run_s": time.perf_counter() - t1})
            else:  # "refuse": invalid options must be refused before IREE sees anything
                _, problem, options = request
                iree_called = AssertionError("IREE was called")
                with mock.patch("convbw_mlir.build.compile.compile_module", side_effect=iree_called):
                    convbw_mlir.compile_op(problem, "host", **options)
                conn.send({"status": "accepted"})
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            conn.send({"status": "error", "type": type(e).__name__, "message": str(e)})


class IsolatedRunner:
    """Compiles and runs problems in one child process, started again after it dies or hangs.

    ``compile_op`` compiles in process; a segfault or LLVM abort there must cost one example, not the run.
    """

    def __init__(self, timeout_s: float = 180.0, calls_per_child: int = 100) -> None:
        self.timeout_s = timeout_s
        # In-process compiles leak (~3 MB per lowering context, ~5 MB per IREE session, measured): a
        # fresh child every this many calls keeps a 2000-problem run at a few hundred MB.
        self.calls_per_child = calls_per_child
        self.starts = 0
        self._calls = 0
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a process holding IREE threads
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="convbw-fuzz-worker")
        self._proc.start()
        child.close()
        self._conn = parent
        self.starts += 1
        self._calls = 0

    def call(self, *request: Any, fresh: bool = False) -> dict[str, Any]:
        """Send one request; ``{"status": "crashed", "exitcode": ...}`` or ``"timeout"`` if the child did not answer.

        ``fresh``: in a new child, closed afterwards (a problem that may damage the compiler's state).
        """
        if self._proc is not None and (fresh or self._calls >= self.calls_per_child):
            self.close()
        answer = self._call(request)
        if fresh:
            self.close()
        return answer

    def _call(self, request: tuple[Any, ...]) -> dict[str, Any]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._calls += 1
        try:
            self._conn.send(request)
            if self._conn.poll(self.timeout_s):
                return self._conn.recv()
            status = "timeout"
        except (EOFError, ConnectionError, OSError):
            status = "crashed"
        self._stop()
        return {"status": status, "exitcode": self._last_exitcode}

    def _stop(self) -> None:
        self._proc.join(2)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._last_exitcode = self._proc.exitcode
        self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        if self._proc is not None:
            self._conn.close()  # the child's recv sees EOF and returns
            self._stop()


# -- strategies --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One drawn example: problem fields, compile options and, for an invalid one, the field its error
    must name (``None`` for a valid case)."""

    fields: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    bad_field: tuple[str, ...] | None = None  # any of these spellings names the field
    mutation: str = ""

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.fields)

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)


@st.composite
def valid_fields(draw: st.DrawFn, rank: int | None = None, one_group: bool = False) -> dict[str, Any]:
    """Problem fields that make a valid, tiny problem (every layout, rank and type pairing); ``rank`` and
    ``one_group`` (G = 1) narrow it to the problems a form takes."""
    rank = rank or draw(st.integers(1, 3))
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    shape = draw(st.sampled_from(["dense", "dense", "dense", "depthwise", "gemm"]))
    grouped = LAYOUTS[layout].grouped and not one_group
    groups = draw(st.integers(1, 4)) if grouped else 1
    channels = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    if shape == "depthwise" and grouped:
        groups, channels = draw(st.integers(2, 8)), (1, 1)
    dims = []
    for _ in range(rank):
        gemm = shape == "gemm"  # 1x1 and unpadded: the explicit-GEMM rewrite (strided too)
        f = 1 if gemm else draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        lo, hi = (0, 0) if gemm else (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
        span = d * (f - 1) + 1
        least = max(1, span - lo - hi)
        size = draw(st.integers(least, max(least, _MAX_INPUT[rank])))
        dims.append((size, f, draw(st.integers(1, 3)), d, lo, hi))
    sizes, filt, stride, dil, lo, hi = (tuple(v) for v in zip(*dims))
    fields = dict(
        groups=groups, batch=draw(st.integers(1, 4)), in_channels=channels[0], out_channels=channels[1],
        input_size=sizes, filter_size=filt, stride=stride, dilation=dil, pad_low=lo, pad_high=hi,
        dtype=draw(st.sampled_from(TYPES)), dw_dtype=draw(st.sampled_from(TYPES)), layout=layout,
    )  # fmt: skip
    epilogue = draw(st.sampled_from(EPILOGUES))
    if epilogue is not None:
        fields["epilogue"] = epilogue
    return fields


# The fused epilogues (none most often): a scale, bilinear with D of dW's type and of f32, accumulate.
EPILOGUES = (None, None, None, Epilogue("scale", 0.5), Epilogue("bilinear", 2.0, -1.5),
             Epilogue("bilinear", 2.0, 2.0, "f32"), Epilogue("accumulate"))  # fmt: skip


def make_d(problem: ConvBwdWeightProblem, seed: int = 1) -> np.ndarray | None:
    """The epilogue's D in dW's layout (its D type), unit-normal; None where the epilogue reads none."""
    ep = problem.epilogue
    if ep is None or not ep.reads_d:
        return None
    dtype = ep.d_dtype or problem.dw_dtype
    return np.random.default_rng(seed).standard_normal(problem.dw_shape).astype(_NP_TYPES[dtype])


def oracle_epilogue(problem: ConvBwdWeightProblem, dw: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    """The epilogue applied to the float64 dW, from its definition: alpha * dW (+ beta * D)."""
    ep = problem.epilogue
    if ep is None:
        return dw
    return ep.alpha * dw + (ep.beta * np.asarray(d, dtype=np.float64) if d is not None else 0.0)


@st.composite
def valid_options(draw: st.DrawFn) -> dict[str, Any]:
    """compile_op options: k_batch 1/2/3/7/rows/auto (or left out) and plan_for any target (or left out)."""
    options: dict[str, Any] = {}
    if draw(st.integers(0, 5)):
        options["k_batch"] = draw(st.sampled_from(K_BATCHES))
    if draw(st.integers(0, 3)):
        options["plan_for"] = draw(st.sampled_from(sorted(TARGETS)))
    return options


_COUNTS = ("groups", "batch", "in_channels", "out_channels")
_TUPLES = ("input_size", "filter_size", "stride", "dilation")
_PADS = ("pad_low", "pad_high")


@st.composite
def invalid_case(draw: st.DrawFn) -> Case:
    """A valid problem with one thing made impossible, and the field its refusal must name."""
    kw = draw(valid_fields())
    options = draw(valid_options())
    rank = len(kw["input_size"])
    what = draw(st.sampled_from([
        "count", "count_type", "size", "pad", "filter_too_big", "tuple_len", "rank", "element_type",
        "dtype", "layout", "groupless_layout", "k_batch", "plan_for",
    ]))  # fmt: skip
    i = draw(st.integers(0, rank - 1))

    def set_elem(name: str, value: Any) -> None:
        kw[name] = tuple(value if j == i else v for j, v in enumerate(kw[name]))

    bad: tuple[str, ...] = ()
    if what == "count":
        name = draw(st.sampled_from(_COUNTS))
        kw[name], bad = draw(st.sampled_from([0, -1, -7])), (name,)
    elif what == "count_type":
        name = draw(st.sampled_from(_COUNTS))
        kw[name], bad = draw(st.sampled_from([2.0, "2", True, None])), (name,)
    elif what == "size":
        name = draw(st.sampled_from(_TUPLES))
        set_elem(name, draw(st.sampled_from([0, -1, -5])))
        bad = (name,)
    elif what == "pad":
        name = draw(st.sampled_from(_PADS))
        set_elem(name, draw(st.sampled_from([-1, -3])))
        bad = (name,)
    elif what == "filter_too_big":  # the dilated filter spans more than the padded input
        padded = kw["input_size"][i] + kw["pad_low"][i] + kw["pad_high"][i]
        set_elem("filter_size", (padded - 1) // kw["dilation"][i] + 2 + draw(st.integers(0, 2)))
        bad = ("filter_size",)
    elif what == "tuple_len":
        name = draw(st.sampled_from(_TUPLES[1:] + _PADS))
        kw[name], bad = (1,) * draw(st.sampled_from([n for n in (1, 2, 3, 4) if n != rank])), (name,)
    elif what == "rank":
        n = draw(st.sampled_from([0, 4]))
        kw.update({k: (1,) * n for k in _TUPLES + _PADS})
        kw["input_size"], bad = (4,) * n, ("input_size",)
    elif what == "element_type":
        name = draw(st.sampled_from(_TUPLES + _PADS))
        set_elem(name, draw(st.sampled_from([1.5, True, "2"])))
        bad = (name,)
    elif what == "dtype":
        name = draw(st.sampled_from(["dtype", "dw_dtype"]))
        kw[name], bad = draw(st.sampled_from(["f64", "int8", "F16", "fp16", ""])), (name,)
    elif what == "layout":
        kw["layout"], bad = draw(st.sampled_from(["NCHWG", "XYZ", 5, 9, -1, ""])), ("layout",)
    elif what == "groupless_layout":
        kw["layout"] = draw(st.sampled_from(["torch", "channels_last"]))
        kw["groups"], bad = draw(st.integers(2, 4)), ("layout", "groups")
    elif what == "k_batch":
        options["k_batch"], bad = draw(st.sampled_from([0, -2, "many", True, 2.5])), ("k_batch", "k-batch")
    else:
        options["plan_for"], bad = draw(st.sampled_from(["gfx000", "cuda", "", "H100x"])), ("plan_for", "plan-for")
    return Case(tuple(kw.items()), tuple(options.items()), bad, what)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """About one example in six invalid (refusal expected), the rest valid problems with options."""
    if draw(st.integers(0, 5)) == 0:
        return draw(invalid_case())
    case = Case(tuple(draw(valid_fields()).items()), tuple(draw(valid_options()).items()))
    k, n = case.opts.get("k_batch"), case.kwargs["batch"]
    if isinstance(k, int) and math.ceil(n / math.ceil(n / k)) != k:  # splits of whole images cannot make k of them
        return Case(case.fields, case.options, ("k-batch",), "k_batch_split")
    return case


# -- outcomes ----------------------------------------------------------------------------------------
def repro(problem_or_fields: ConvBwdWeightProblem | dict[str, Any], options: dict[str, Any]) -> str:
    """A replayable description: ckProfiler problem line, layout, types and the compile_op options."""
    if isinstance(problem_or_fields, ConvBwdWeightProblem):
        p = problem_or_fields
        # ckProfiler's problem part, spelled here: to_ck() refuses the PyTorch layouts (no ck code)
        nums = [p.rank, p.groups, p.batch, p.out_channels, p.in_channels, *p.filter_size, *p.input_size,
                *p.stride, *p.dilation, *p.pad_low, *p.pad_high]  # fmt: skip
        ck = " ".join(map(str, nums))
        text = f'--ck "{ck}" --layout {p.layout} --type {p.dtype} --dw-type {p.dw_dtype}'
        if p.epilogue is not None:
            text += f" epilogue={p.epilogue!r}"
    else:
        text = "fields " + ", ".join(f"{k}={v!r}" for k, v in problem_or_fields.items())
    opts = " ".join(f"{k}={v!r}" for k, v in options.items())
    return f"{text}{' options ' + opts if opts else ''}"


def _unit_output_strided_filter(p: ConvBwdWeightProblem) -> bool:
    return any(o == 1 and f > 1 and s > 1 for o, f, s in zip(p.output_size, p.filter_size, p.stride))


def _channels_first_padded_single_output(p: ConvBwdWeightProblem) -> bool:
    x = p.dims("x")
    spatial = next(i for i, d in enumerate(x) if d in "DHW")
    padded = any(p.pad_low) or any(p.pad_high)
    return p.batch == 1 and all(o == 1 for o in p.output_size) and x.index("C") < spatial and padded


@dataclass(frozen=True)
class KnownFailure:
    """A failure reported and not fixed yet: the problems it hits, the error text it gives (``crashed``
    for a dead compiler process), and one reproducer the test keeps as a strict xfail.

    ``compiles``: how many compiles in one process the reproducer needs (heap damage that kills a later
    compile); problems it applies to are compiled in a child of their own, so they harm no other example.
    """

    name: str
    message: str
    ck: str
    applies: Callable[[ConvBwdWeightProblem], bool]
    fields: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    compiles: int = 1

    @property
    def problem(self) -> ConvBwdWeightProblem:
        return ConvBwdWeightProblem.from_ck(self.ck).with_(**dict(self.fields))


# Failures the fuzzer found, fixed since, kept as reproducers that must compile and match
# (tests/test_fuzz.py): a known failure moves here when its fix lands.
FIXED_FAILURES: tuple[KnownFailure, ...] = (
    # The linalg verifier refused the contraction ("inferred input/output operand #2 has shape's
    # dimension #1 to be 4, but found 3"): x indexed by the filter loop alone; the lowering slices x now.
    KnownFailure("unit-output-strided-filter", "has shape's dimension", "2 1 2 4 4 3 3 4 8 2 1 1 1 0 0 0 0",
                 _unit_output_strided_filter),
    # IREE segfaulted in Invocation.execute on the third compile of this module in one process (host and
    # gfx942): reproduced on every run before IREE's diagnostics were taken through its C callback, on
    # none after.
    KnownFailure("iree-segfault-channels-first-padded-1x1-output", "crashed", "2 1 1 2 2 1 3 1 2 2 2 1 1 1 0 0 1",
                 _channels_first_padded_single_output, (("layout", "NCHW/KCYX/NKHW"),), compiles=3),
)  # fmt: skip
# Failures reported and not fixed yet (none now): matching errors count as known, not as new failures.
KNOWN_FAILURES: tuple[KnownFailure, ...] = ()


def known_failure(problem: ConvBwdWeightProblem, message: str) -> str | None:
    """The name of the known failure this error is, or None for a new one."""
    for known in KNOWN_FAILURES:
        if known.message in message and known.applies(problem):
            return known.name
    return None


def needs_own_child(problem: ConvBwdWeightProblem) -> bool:
    """Whether a known crash applies: compile in a fresh child, dropped afterwards."""
    return any(k.message == "crashed" and k.applies(problem) for k in KNOWN_FAILURES)


@dataclass
class FuzzStats:
    """Counts of outcomes, the compile times, and every unexpected outcome with its reproducer."""

    counts: Counter = field(default_factory=Counter)
    compile_s: list[float] = field(default_factory=list)
    case_s: list[float] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    seen: dict[Case, str] = field(default_factory=dict)
    last: str = ""  # the valid problem compiled last (blamed when a crash does not repeat alone)

    def fail(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        self.failures.setdefault(kind, []).append(text)

    def progress(self) -> str:
        c = self.counts
        bad = sum(len(t) for t in self.failures.values())
        return f"fuzz: {c['examples']} examples, {c['correct']} correct, {c['refused']} refused, {bad} unexpected"

    def summary(self) -> str:
        c = self.counts
        lines = [
            f"fuzz: {c['examples']} examples ({c['repeats']} repeats reused), {c['valid']} valid, "
            f"{c['invalid']} invalid",
            f"  valid:   {c['correct']} correct, {c['known']} known failures, {c['wrong']} wrong, "
            f"{c['error']} errors, {c['crashed']} crashed, {c['timeout']} timed out",
            f"  invalid: {c['refused']} refused, {c['unclear']} refused without naming the field, "
            f"{c['accepted']} accepted",
        ]
        if self.compile_s:
            per = np.array(self.case_s)
            lines.append(
                f"  time per compiled problem: median {np.median(per):.2f} s, max {per.max():.2f} s "
                f"(compile median {np.median(self.compile_s):.2f} s); worker starts: {c['starts']}"
            )
        for kind, texts in self.failures.items():
            lines.append(f"  {kind}: {len(texts)}")
            lines.extend(f"    {t}" for t in texts)
        return "\n".join(lines)


def check_case(case: Case, runner: IsolatedRunner, stats: FuzzStats) -> None:
    """Run one case and record its outcome (never raises for the product's failures)."""
    stats.counts["examples"] += 1
    if case in stats.seen:  # hypothesis repeats: the same problem and options gave this outcome already
        stats.counts["repeats"] += 1
        return
    stats.counts["valid" if case.bad_field is None else "invalid"] += 1
    t0 = time.perf_counter()
    try:
        problem = ConvBwdWeightProblem(**case.kwargs)
        refusal = None
    except (ValueError, TypeError) as e:
        problem, refusal = None, e
    if case.bad_field is not None:
        outcome = _check_refusal(case, problem, refusal, runner, stats)
    elif refusal is not None:
        outcome = "refused-valid"
        stats.fail(outcome, f"{repro(case.kwargs, case.opts)}: {type(refusal).__name__}: {refusal}")
    else:
        outcome = _check_valid(case, problem, runner, stats)
        stats.case_s.append(time.perf_counter() - t0)
    stats.seen[case] = outcome


def _check_refusal(case: Case, problem: Any, refusal: Any, runner: IsolatedRunner, stats: FuzzStats) -> str:
    where = f"[{case.mutation}] {repro(case.kwargs, case.opts)}"
    if problem is not None:  # a bad option: the problem is fine, compile_op must refuse before IREE
        answer = runner.call("refuse", problem, case.opts)
        if answer["status"] == "accepted":
            stats.fail("accepted", where)
            return "accepted"
        if answer["status"] != "error":
            stats.fail(answer["status"], f"{where}: exit code {answer.get('exitcode')}")
            return answer["status"]
        kind, message = answer["type"], answer["message"]
    else:
        kind, message = type(refusal).__name__, str(refusal)
    if kind not in ("ValueError", "TypeError", "PipelineError", "PlanError") or not any(
        f in message for f in case.bad_field
    ):
        stats.fail("unclear", f"{where}: {kind}: {message}")
        return "unclear"
    stats.counts["refused"] += 1
    return "refused"


def _check_valid(case: Case, problem: ConvBwdWeightProblem, runner: IsolatedRunner, stats: FuzzStats) -> str:
    where = repro(problem, case.opts)
    prev, stats.last = stats.last, where
    x, dy = make_inputs(problem)
    d = make_d(problem)
    starts = runner.starts
    answer = runner.call("run", problem, case.opts, x, dy, 1, d, fresh=needs_own_child(problem))
    stats.counts["starts"] += runner.starts - starts
    status = answer["status"]
    if status == "ok":
        stats.compile_s.append(answer["compile_s"])
        want = oracle_epilogue(problem, oracle_dw(problem, x, dy), d)
        err, tol = max_error(answer["dw"], want), tolerance(problem)
        shape_ok = answer["dw"].shape == problem.dw_shape and answer["dw"].dtype == _NP_TYPES[problem.dw_dtype]
        if shape_ok and err <= tol:
            stats.counts["correct"] += 1
            return "correct"
        known = known_failure(problem, "wrong result")
        if known:
            stats.counts["known"] += 1
            return "known"
        got = f"{answer['dw'].shape} {answer['dw'].dtype}"
        stats.fail("wrong", f"{where}: max error {err:.3g} > tolerance {tol:.3g} (dW {got})")
        return "wrong"
    if status == "error":
        message = f"{answer['type']}: {answer['message']}"
        if known_failure(problem, message):
            stats.counts["known"] += 1
            return "known"
        stats.fail("error", f"{where}: {_first_error_line(message)}")
        return "error"
    if status == "crashed" and known_failure(problem, "crashed"):
        stats.counts["known"] += 1
        return "known"
    # A crash may come from damage an earlier compile left in the process: say which, by a fresh retry.
    again = runner.call("run", problem, case.opts, x, dy, 1, d, fresh=True)["status"]
    blame = "also alone in a fresh child" if again == status else f"not alone (fresh child: {again}); after {prev}"
    stats.fail(status, f"{where}: child exit code {answer.get('exitcode')}, {blame}")
    return status


def _first_error_line(message: str) -> str:
    """The first 'error:' line of MLIR's diagnostics (the notes after it repeat the IR)."""
    for line in message.splitlines():
        if "error" in line:
            return line.strip()[:400]
    return message.strip().splitlines()[0][:400] if message.strip() else message
