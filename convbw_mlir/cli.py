"""The ``convbw`` command: compile and run one problem.

    convbw run --miopen "convfp16 -F 4 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -m conv -g 1"
    convbw run --ck "2 1 4 64 64 3 3 56 56 1 1 1 1 1 1 1 1" --target host --type f16
    convbw run -g 2 -n 4 -c 8 -k 16 --input 14x14 --filter 3x3 --pad 1
    convbw compile --ck "..." --target gfx942 --emit linalg -o out.mlir

Errors are one line on stderr and exit code 1. The IREE compile runs in a child process
(:mod:`convbw_mlir.isolate`), so that an IREE crash is reported as such.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from convbw_mlir.files import write_atomic
from convbw_mlir.problem import DEFAULT_LAYOUT, DTYPES, ConvBwdWeightProblem, Epilogue

__all__ = [
    "ArgumentParser",
    "add_epilogue_arguments",
    "add_problem_arguments",
    "epilogue_from_args",
    "main",
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
    g.add_argument("--dw-type", dest="dw_dtype", choices=list(DTYPES), help="element type of dW (default: --type)")
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
        overrides["dw_dtype"] = args.dw_dtype or args.dtype
    elif args.dw_dtype:
        overrides["dw_dtype"] = args.dw_dtype
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


def _cmd_run(args: argparse.Namespace) -> int:
    from convbw_mlir.compiler import compile_op
    from convbw_mlir.reference import assert_close, random_inputs, reference
    from convbw_mlir.runtime import check_inputs, time_calls

    problem = problem_from_args(args)
    print(f"problem: {problem.to_ck() if problem.layout_family.ck_code is not None else problem.name}")
    print(f"layout:  {problem.layout_family.spelled(problem.rank)}  types: {problem.dtype} -> {problem.dw_dtype}")
    ep = problem.epilogue
    if ep is not None:  # the epilogue block: D random, for accumulate the output's initial contents
        from convbw_mlir.epilogues import random_d

        print(f"epilogue: {ep.kind} alpha={ep.alpha:g}" + (f" beta={ep.beta:g} D {ep.d_dtype}" if ep.reads_d else ""))
    t0 = time.perf_counter()
    op = compile_op(problem, args.target, isolate=True)
    print(f"compile: {time.perf_counter() - t0:.2f} s for {args.target}")
    x, dy = random_inputs(problem, args.seed)
    d = random_d(problem, args.seed + 1) if ep is not None else None
    kernel = op.kernel(args.device)
    x, dy = check_inputs(problem, x, dy)
    xd, dyd = kernel.to_device(x), kernel.to_device(dy)
    samples = time_calls(kernel, xd, dyd, *([kernel.to_device(d)] if d is not None else []), min_reps=args.reps)
    if ep is not None and ep.kind == "accumulate":
        dw = op.run(x, dy, out=d.copy(), device=args.device)
    else:
        dw = op.run(x, dy, d, device=args.device)
    med = statistics.median(samples)
    print(f"time:    {med * 1e6:.1f} us (median of {len(samples)}), {problem.flops / med / 1e12:.4f} TFLOP/s")
    if args.no_verify:
        print("verify:  skipped")
        return 0
    from convbw_mlir.plan import uses_matrix_cores
    from convbw_mlir.targets import get_target

    target = get_target(args.target)  # GPU kernels may accumulate in matrix instructions: a wider bound
    matrix_cores = target.is_gpu and uses_matrix_cores(problem, target)
    err = assert_close(problem, dw, reference(problem, x, dy, d), matrix_cores)
    print(f"verify:  max error {err:.3g} (relative to the reference's RMS), PASS")
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from convbw_mlir.compiler import CompiledOp, compile_op
    from convbw_mlir.isolate import call

    problem = problem_from_args(args)
    if args.emit == "vmfb" and args.output == "-" and sys.stdout.isatty():
        raise ValueError("-o: refusing to write a vmfb to a terminal; give -o FILE")
    op = compile_op(problem, args.target, isolate=True)
    if args.isa_report:
        print(call(CompiledOp.isa_report, op, what=f"{problem.name} for {args.target}").summary())
        return 0
    data: bytes | str = op.vmfb if args.emit == "vmfb" else op.stages[args.emit]
    write_output(args.output, data)
    if args.output != "-":
        print(f"wrote {args.output} ({args.emit}, {args.target})", file=sys.stderr)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from convbw_mlir.bench.artifacts import write_artifacts
    from convbw_mlir.bench.suites import load_suite
    from convbw_mlir.files import check_output

    check_output(args.out)  # before the build: a folder of the user's is refused, not replaced
    problems = []
    for dtype in args.types.split(","):
        if dtype not in DTYPES:
            raise ValueError(f"--types: unknown element type {dtype!r}; known: {', '.join(DTYPES)}")
        for suite in args.suite:
            problems += [(n, p) for n, p in load_suite(suite, dtype) if args.filter in n]
    if not problems:
        raise ValueError("--suite: no problems selected")
    out = write_artifacts(problems, args.target, args.out)
    print(f"wrote {len(problems)} problems for {args.target} to {out} (manifest.json)")
    if args.compile_only:
        return 0
    from convbw_mlir.bench.run import main as run_main
    from convbw_mlir.files import record_output

    status = run_main([str(out), *(["--no-torch"] if args.target == "host" else [])])
    record_output(out, "results.json", "results.md", "results.png")  # ours: the next --out may replace them
    return status


def build_parser() -> argparse.ArgumentParser:
    from convbw_mlir.dispatch.cli import add_dispatch_commands, int_at_least  # tune, cache, select
    from convbw_mlir.targets import TARGETS

    parser = ArgumentParser(prog="convbw", description="Compile and run conv backward-weight kernels.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    run = sub.add_parser("run", help="compile, run on random data, verify, time")
    comp = sub.add_parser("compile", help="compile and write the IR or the vmfb")
    for p in (run, comp):
        add_problem_arguments(p)
        p.add_argument("--target", default="host", choices=list(TARGETS), metavar="TARGET",
                       help=f"one of {', '.join(TARGETS)} (default host)")  # fmt: skip
    run.add_argument("--device", type=int, default=None, help="device index of the target's driver")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--reps", type=int_at_least(1), default=20, help="minimum timed repetitions (>= 1)")
    run.add_argument("--no-verify", action="store_true", help="skip the float64 reference check")
    run.set_defaults(func=_cmd_run)
    comp.add_argument("--emit", choices=["convbw", "linalg", "vmfb"], default="linalg")
    comp.add_argument("-o", "--output", default="-", help="output file, - for stdout")
    comp.add_argument("--isa-report", action="store_true", help="print the ISA report of a GPU target's kernels")
    comp.set_defaults(func=_cmd_compile)
    bench = sub.add_parser("bench", help="compile every contender of suites (and run them unless --compile-only)")
    bench.add_argument("--suite", action="append", required=True, help="shipped suite name or .tsv path")
    bench.add_argument("--target", default="sm_80", choices=list(TARGETS), metavar="TARGET")
    bench.add_argument("--types", default="f16", help="comma-separated element types (f16,bf16,f32)")
    bench.add_argument("--filter", default="", help="only problems whose name contains this")
    bench.add_argument("--compile-only", action="store_true", help="write the artifacts, run nothing")
    bench.add_argument("--out", required=True, help="artifact folder (e.g. .art)")
    bench.set_defaults(func=_cmd_bench)

    add_dispatch_commands(sub)
    return parser


def run_cli(prog: str, build: Callable[[], argparse.ArgumentParser], argv: list[str] | None) -> int:
    """Parse and dispatch; every error a user can cause becomes one line on stderr and exit code 1."""
    from convbw_mlir.reference import ToleranceError
    from convbw_mlir.runtime import DeviceError

    errors: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError, DeviceError, ToleranceError)
    try:
        from convbw_mlir.compiler import CompileError
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


def main(argv: list[str] | None = None) -> int:
    return run_cli("convbw", build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
