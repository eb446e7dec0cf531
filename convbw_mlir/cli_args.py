"""What the command lines share (``convbw``, its dispatcher commands, ``convbw-opt``): a parser whose errors are
one line, the problem and epilogue flags, argument types, atomic output, and :func:`run_cli` (every error a user
can cause: one line on stderr, exit code 1)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from convbw_mlir.files import write_atomic
from convbw_mlir.problem import DEFAULT_LAYOUT, DTYPES, FP8_DTYPES, ConvBwdWeightProblem, Epilogue

__all__ = [
    "ArgumentParser",
    "add_epilogue_arguments",
    "add_problem_arguments",
    "epilogue_from_args",
    "int_at_least",
    "problem_from_args",
    "run_cli",
    "write_output",
]


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so every error is one line (exit code 1)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ValueError(f"{self.prog}: {message}")


def write_output(path: str, data: bytes | str, flag: str = "-o") -> None:
    """Write an output file atomically (``-``: stdout).

    Raises:
        ValueError: it cannot be written; names ``flag`` and ``path``, not the temporary file beside it.
    """
    try:
        write_atomic(path, data)
    except OSError as e:  # it names the folder or the temporary file beside the path: name the path
        blocker = next((p for p in Path(path).parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise ValueError(f"{flag}: cannot write {path}: {blocker} is not a folder") from None
        raise ValueError(f"{flag}: cannot write {path}: {e.strerror or e}") from None


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 56x56 or 3, got {text!r}") from None


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def add_epilogue_arguments(parser: argparse.ArgumentParser) -> None:
    """The epilogue flags (docs/epilogues.md), shared by ``convbw`` and ``convbw-opt``."""
    e = parser.add_argument_group("epilogue (applied where dW is written; docs/epilogues.md)")
    e.add_argument("--scale", type=_finite_float, metavar="S", help="dW = S * (x * dy)")
    e.add_argument("--alpha", type=_finite_float, metavar="A", help="dW = A * (x * dy) + B * D (bilinear; default 1)")
    e.add_argument("--beta", type=_finite_float, metavar="B", help="the bilinear/accumulate B (default 1)")
    e.add_argument("--accumulate", action="store_true", help="D is the output itself: dW = A * (x * dy) + B * dW")
    e.add_argument("--d-type", dest="d_dtype", choices=list(DTYPES), help="bilinear D's type: dW's (default) or f32")


def epilogue_from_args(args: argparse.Namespace) -> Epilogue | None:
    """The epilogue the flags ask for, or None.

    Raises:
        ValueError: conflicting flags (naming them) or an invalid epilogue.
    """
    scale, alpha, beta = getattr(args, "scale", None), getattr(args, "alpha", None), getattr(args, "beta", None)
    accumulate, d_dtype = getattr(args, "accumulate", False), getattr(args, "d_dtype", None)
    if scale is not None:
        others = [f for f, v in (("--alpha", alpha), ("--beta", beta), ("--d-type", d_dtype)) if v is not None]
        if accumulate:
            others.append("--accumulate")
        if others:
            raise ValueError(f"--scale: does not combine with {', '.join(others)} (bilinear: --alpha/--beta)")
        return Epilogue("scale", scale)
    if accumulate:
        if d_dtype is not None:
            raise ValueError("--d-type: accumulate reads D from the output itself, of dW's type")
        return Epilogue("accumulate", 1.0 if alpha is None else alpha, 1.0 if beta is None else beta)
    if alpha is None and beta is None:
        if d_dtype is not None:
            raise ValueError("--d-type: applies to a bilinear epilogue (--alpha/--beta)")
        return None
    return Epilogue("bilinear", 1.0 if alpha is None else alpha, 1.0 if beta is None else beta, d_dtype)


def add_problem_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The problem flags shared by ``convbw`` and ``convbw-opt``."""
    g = parser.add_argument_group("problem (named flags, or --ck / --miopen)")
    g.add_argument(
        "--ck", metavar="LINE", help="ckProfiler grouped_conv_bwd_weight arguments (whole line or problem part)"
    )
    g.add_argument("--miopen", metavar="LINE", help="MIOpenDriver line, e.g. 'convfp16 -F 4 -n 4 -c 64 ...'")
    g.add_argument("-g", "--groups", type=int, default=1, help="G (default 1)")
    g.add_argument("-n", "--batch", type=int, help="N")
    g.add_argument("-c", "--in-channels", type=int, help="C per group")
    g.add_argument("-k", "--out-channels", type=int, help="K per group")
    g.add_argument("--input", type=_sizes, help="input spatial sizes, e.g. 56x56 (1 to 3 values)")
    g.add_argument("--filter", type=_sizes, help="filter sizes, e.g. 3x3")
    g.add_argument("--stride", type=_sizes, default=(1,), help="strides (one value broadcasts)")
    g.add_argument("--dilation", type=_sizes, default=(1,), help="dilations")
    g.add_argument("--pad", type=_sizes, help="symmetric pads")
    g.add_argument("--pad-low", type=_sizes, help="left/top pads")
    g.add_argument("--pad-high", type=_sizes, help="right/bottom pads")
    g.add_argument("--layout", help=f"layout family or ckProfiler code 0-4 (default {DEFAULT_LAYOUT})")
    g.add_argument("--type", "--dtype", dest="dtype", choices=list(DTYPES), help="element type of x and dy")
    g.add_argument("--dy-type", dest="dy_dtype", choices=list(DTYPES),
                   help="element type of dy where it differs (fp8: --type e4m3 --dy-type e5m2)")  # fmt: skip
    g.add_argument("--dw-type", dest="dw_dtype", choices=list(DTYPES),
                   help="element type of dW (default: --type; f32 for fp8)")  # fmt: skip
    add_epilogue_arguments(parser)


def _broadcast(name: str, values: tuple[int, ...] | None, rank: int, default: int) -> tuple[int, ...]:
    if values is None:
        return (default,) * rank
    if len(values) == 1:
        return values * rank
    if len(values) != rank:
        raise ValueError(f"--{name}: expected 1 or {rank} values, got {'x'.join(map(str, values))}")
    return values


def problem_from_args(args: argparse.Namespace) -> ConvBwdWeightProblem:
    """Build the problem from parsed flags; ``--type``/``--dw-type``/``--layout`` override a parsed line.

    Raises:
        ValueError: missing or conflicting flags, or an invalid problem (naming the field).
    """
    problem = _problem_from_args(args)
    epilogue = epilogue_from_args(args)
    return problem.with_(epilogue=epilogue) if epilogue is not None else problem


def _problem_from_args(args: argparse.Namespace) -> ConvBwdWeightProblem:
    overrides: dict[str, Any] = {}
    if args.dtype:
        overrides["dtype"] = args.dtype
        # fp8 inputs: dW's type is the problem's default (f32), never the input type
        overrides["dw_dtype"] = args.dw_dtype or (None if args.dtype in FP8_DTYPES else args.dtype)
    elif args.dw_dtype:
        overrides["dw_dtype"] = args.dw_dtype
    if getattr(args, "dy_dtype", None):
        overrides["dy_dtype"] = args.dy_dtype
    if args.layout is not None:
        overrides["layout"] = int(args.layout) if args.layout.isdigit() else args.layout
    if args.ck and args.miopen:
        raise ValueError("problem: give --ck or --miopen, not both")
    if args.ck or args.miopen:
        base = ConvBwdWeightProblem.from_ck(args.ck) if args.ck else ConvBwdWeightProblem.from_miopen(args.miopen)
        return base.with_(**overrides) if overrides else base
    missing = [f"--{n.replace('_', '-')}" for n in ("batch", "in_channels", "out_channels", "input", "filter")
               if getattr(args, n) is None]  # fmt: skip
    if missing:
        raise ValueError(f"problem: missing {', '.join(missing)} (or give --ck / --miopen)")
    rank = len(args.input)
    if args.pad is not None and (args.pad_low is not None or args.pad_high is not None):
        raise ValueError("--pad: give --pad or --pad-low/--pad-high, not both")
    return ConvBwdWeightProblem(
        groups=args.groups,
        batch=args.batch,
        in_channels=args.in_channels,
        out_channels=args.out_channels,
        input_size=args.input,
        filter_size=_broadcast("filter", args.filter, rank, 1),
        stride=_broadcast("stride", args.stride, rank, 1),
        dilation=_broadcast("dilation", args.dilation, rank, 1),
        pad_low=_broadcast("pad-low", args.pad if args.pad is not None else args.pad_low, rank, 0),
        pad_high=_broadcast("pad-high", args.pad if args.pad is not None else args.pad_high, rank, 0),
        **{"dtype": "f16", "layout": DEFAULT_LAYOUT, **overrides},
    )


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt, so that cleanups run (a child compile is
    killed, its temporary files removed) instead of the process ending where it stands."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated(signum)


def run_cli(prog: str, build: Callable[[], argparse.ArgumentParser], argv: list[str] | None) -> int:
    """Parse and dispatch; every error a user can cause becomes one line on stderr and exit code 1; Ctrl-C is
    one line and exit code 130, SIGTERM one line and 143 (128 + the signal), after the cleanups ran."""
    import signal
    import threading

    handles_term = threading.current_thread() is threading.main_thread()  # signal.signal works there only
    previous = signal.signal(signal.SIGTERM, _terminate) if handles_term else None
    try:
        return _run_cli(prog, build, argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except _Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if handles_term:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _run_cli(prog: str, build: Callable[[], argparse.ArgumentParser], argv: list[str] | None) -> int:
    from convbw_mlir.reference import ToleranceError
    from convbw_mlir.runtime import DeviceError

    errors: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError, DeviceError, ToleranceError)
    try:
        from convbw_mlir.build.iree import CompileError
        from convbw_mlir.dispatch.cache import CacheError

        errors += (CompileError, CacheError)
    except ImportError:  # pragma: no cover - runtime-only installs still report the other errors
        pass
    import warnings

    # A warning (a cache that cannot be written, a bad database entry) is one line too, not a source excerpt.
    warnings.formatwarning = lambda message, *_args, **_kw: f"{prog}: warning: {message}\n"
    try:
        args = build().parse_args(argv)
        with _one_line_warnings(prog):
            return args.func(args)
    except errors as e:
        message = str(e).strip().replace("\n", " | ") or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _one_line_warnings(prog: str) -> Iterator[None]:
    """Warnings (a database entry ignored, a cache entry rebuilt) as one line each, like the errors."""
    previous = warnings.formatwarning
    warnings.formatwarning = lambda message, *_args, **_kw: f"{prog}: warning: {message}\n"
    try:
        yield
    finally:
        warnings.formatwarning = previous


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """``--deterministic`` and ``--max-workspace-bytes N``: the plan restricted as ``compile_op`` restricts it."""
    parser.add_argument("--deterministic", action="store_true",
                        help="only a kernel whose result is bitwise the same run after run")  # fmt: skip
    parser.add_argument("--max-workspace-bytes", type=int_at_least(0), default=None, metavar="N",
                        help="only a kernel needing at most N bytes of device memory beyond x, dy and dW")  # fmt: skip


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= low``; anything else is refused naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse
