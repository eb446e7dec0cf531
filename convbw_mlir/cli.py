"""The ``convbw`` command: compile and run one problem.

    convbw run --miopen "convfp16 -F 4 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -m conv -g 1"
    convbw run --ck "2 1 4 64 64 3 3 56 56 1 1 1 1 1 1 1 1" --target host --type f16
    convbw run -g 2 -n 4 -c 8 -k 16 --input 14x14 --filter 3x3 --pad 1
    convbw compile --ck "..." --target gfx942 --emit linalg -o out.mlir
    convbw module step.pt2 --target host -o step.vmfb     (a whole module: torch.export.save'd or .mlir)

Errors are one line on stderr and exit code 1. The IREE compile runs in a child process
(:mod:`convbw_mlir.build.isolate`), so that an IREE crash is reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from convbw_mlir.cli_args import (
    ArgumentParser,
    _sizes,
    add_problem_arguments,
    add_request_arguments,
    int_at_least,
    problem_from_args,
    run_cli,
    write_output,
)
from convbw_mlir.problem import DTYPES

__all__ = ["build_parser", "main"]


def _cmd_run(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch.api import compile_op
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
    op = compile_op(problem, args.target, isolate=True, deterministic=args.deterministic,
                    max_workspace_bytes=args.max_workspace_bytes)  # fmt: skip
    print(f"compile: {time.perf_counter() - t0:.2f} s for {args.target}")
    plan = op.plan
    if plan is not None and plan.workspace_bytes is not None:
        print(f"plan:    {plan.strategy.value}, workspace {plan.workspace_bytes} bytes, "
              f"{'deterministic' if plan.deterministic else 'not deterministic'}")  # fmt: skip
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
    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.build.isolate import call
    from convbw_mlir.dispatch.api import compile_op

    problem = problem_from_args(args)
    if args.emit == "vmfb" and args.output == "-" and sys.stdout.isatty():
        raise ValueError("-o: refusing to write a vmfb to a terminal; give -o FILE")
    op = compile_op(problem, args.target, isolate=True, deterministic=args.deterministic,
                    max_workspace_bytes=args.max_workspace_bytes)  # fmt: skip
    if args.isa_report:
        print(call(CompiledOp.isa_report, op, what=f"{problem.name} for {args.target}").summary())
        return 0
    data: bytes | str = op.vmfb if args.emit == "vmfb" else op.stages[args.emit]
    write_output(args.output, data)
    if args.output != "-":
        print(f"wrote {args.output} ({args.emit}, {args.target})", file=sys.stderr)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from convbw_mlir.build.contenders import write_artifacts
    from convbw_mlir.files import check_output
    from convbw_mlir.suites import load_suite

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
    from convbw_mlir.files import record_output
    from convbw_mlir.measure.run import main as run_main

    status = run_main([str(out), *(["--no-torch"] if args.target == "host" else [])])
    record_output(out, "results.json", "results.md", "results.png")  # ours: the next --out may replace them
    return status


def _cmd_module(args: argparse.Namespace) -> int:
    """A whole module (a saved ExportedProgram, torch IR or input-phase linalg) to one vmfb, ours on each dW."""
    from pathlib import Path

    from convbw_mlir.dispatch.module import compile_module

    path = Path(args.input)
    if not path.is_file():
        raise ValueError(f"input: {args.input} is not a file")
    if args.emit == "vmfb" and args.output == "-" and sys.stdout.isatty():
        raise ValueError("-o: refusing to write a vmfb to a terminal; give -o FILE")
    if path.suffix == ".pt2":
        try:
            import torch
        except ImportError:
            raise ValueError(f"input: {args.input} is a torch program; reading it needs torch") from None
        source = torch.export.load(str(path))
    else:
        source = path.read_text()
    compiled = compile_module(source, args.target, isolate=True)
    for r in compiled.raised:
        print(f"raised: {r.problem.name} ({r.variant})", file=sys.stderr)
    for line in compiled.not_raised:
        print(f"left to IREE: {line}", file=sys.stderr)
    data = {"vmfb": compiled.vmfb, "input": compiled.input_ir, "lowered": compiled.lowered_ir}[args.emit]
    write_output(args.output, data)
    print(f"{len(compiled.raised)} weight gradients ours, {len(compiled.not_raised)} contractions IREE's"
          + (f"; wrote {args.output}" if args.output != "-" else ""), file=sys.stderr)  # fmt: skip
    return 0


def _positive_list(text: str) -> list[int]:
    """``32,64`` -> [32, 64]: integers >= 1."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 like 32,64, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 like 32,64, got {text!r}")
    return values


def _cmd_problems(args: argparse.Namespace) -> int:
    """Trace models on the meta device and write their distinct weight-gradient problems as a suite."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ValueError("problems: needs torch and the model libraries: pip install 'convbw-mlir[zoo]'") from None
    from convbw_mlir.torch import zoo

    if args.input < 1:
        raise ValueError(f"--input: expected an image size >= 1, got {args.input}")
    video = tuple(args.video_input)
    if len(video) != 3 or min(video) < 1:
        raise ValueError(f"--video-input: expected frames x height x width like 16x112x112, got {args.video_input}")
    models = [] if not args.zoo else list(zoo.ZOO)
    for source in zoo.SOURCES:
        for name in getattr(args, f"from_{source}") or []:
            models += [(source, n.strip(), {}) for n in name.split(",") if n.strip()]
    if not models:
        raise ValueError("problems: no models (give --from-torchvision, --from-timm, --from-transformers or --zoo)")
    for source in {s for s, _, _ in models}:  # unknown names and missing libraries: one line, before tracing
        lib = zoo._import(source)
        known = set(zoo._names(source, lib))
        for s, n, _ in models:
            if s == source and n not in known:
                raise ValueError(f"--from-{source}: unknown model {n!r}")
    traced, failed = zoo.zoo_problems(models, args.batch, image=args.input, video=video,
                                      log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    if not traced:
        raise ValueError(f"problems: no model traced ({'; '.join(f'{k}: {v}' for k, v in failed.items())})")
    what = f"images {args.input}x{args.input}, videos {'x'.join(map(str, video))}, speech 1 s at 16 kHz"
    traced_models = len(models) - len(failed)
    versions = zoo.library_versions(s for s, _, _ in models)
    header = [f"convbw problems: {traced_models} models traced on the meta device ({versions}), {what}, "
              f"batches {','.join(map(str, args.batch))}"]  # fmt: skip
    text = zoo.suite_text(traced, header, failed)
    write_output(args.output, text)
    if args.output != "-":
        n = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"wrote {args.output}: {n} distinct problems of {len(models) - len(failed)} models "
              f"({len(failed)} failed)", file=sys.stderr)  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    from convbw_mlir.cli_dispatch import add_dispatch_commands  # tune, cache, select
    from convbw_mlir.targets import TARGETS

    parser = ArgumentParser(prog="convbw", description="Compile and run conv backward-weight kernels.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    run = sub.add_parser("run", help="compile, run on random data, verify, time")
    comp = sub.add_parser("compile", help="compile and write the IR or the vmfb")
    for p in (run, comp):
        add_problem_arguments(p)
        add_request_arguments(p)
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

    probs = sub.add_parser("problems", help="trace models (meta device, no weights) into a suite of problems")
    probs.add_argument("--from-torchvision", action="append", metavar="MODELS", help="comma-separated names")
    probs.add_argument("--from-timm", action="append", metavar="MODELS", help="comma-separated names")
    speech = "speech encoders: wav2vec2, hubert, wavlm, data2vec-audio, sew, unispeech, whisper"
    probs.add_argument("--from-transformers", action="append", metavar="MODELS", help=speech)
    probs.add_argument("--zoo", action="store_true", help="the shipped zoo's models (convbw_mlir.torch.zoo.ZOO)")
    probs.add_argument("--input", type=int, default=224, help="image height and width (default 224)")
    probs.add_argument("--video-input", type=_sizes, default=(16, 112, 112), help="video frames x height x width")
    probs.add_argument("--batch", type=_positive_list, default=[32], help="batch sizes, e.g. 32,64 (default 32)")
    probs.add_argument("-o", "--output", default="-", help="suite .tsv to write, - for stdout")
    probs.set_defaults(func=_cmd_problems)

    mod = sub.add_parser("module", help="compile a whole module (training step) with ours on each weight gradient")
    mod.add_argument("input", help="a torch.export.save'd program (.pt2), torch IR or IREE input-phase linalg (.mlir)")
    mod.add_argument("--target", default="host", choices=list(TARGETS), metavar="TARGET")
    mod.add_argument("--emit", choices=["vmfb", "input", "lowered"], default="vmfb",
                     help="the vmfb, the linalg of IREE's input phase, or that module after our passes")  # fmt: skip
    mod.add_argument("-o", "--output", default="-", help="output file, - for stdout")
    mod.set_defaults(func=_cmd_module)

    add_dispatch_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_cli("convbw", build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
