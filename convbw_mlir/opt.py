"""``convbw-opt``: run convbw and MLIR passes on IR, the way ``mlir-opt`` and ``iree-opt`` do.

    convbw-opt in.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,canonicalize,cse)'
    convbw-opt in.mlir --convbw-pipeline=gfx942 [--print-pipeline] [--emit=isa]
    convbw-opt --ck "2 1 4 64 64 3 3 14 14 1 1 1 1 1 1 1 1" --convbw-pipeline=host
    convbw-opt tests.mlir --split-input-file --verify-diagnostics --pass-pipeline=...
    convbw-opt --list-passes

A failing pass prints its diagnostics (file:line:col), writes a reproducer (the IR the failing pass
saw, with the replay command in its first line) next to the output, and exits with code 1.
``--emit=vmfb|isa`` compiles in a child process (:mod:`convbw_mlir.build.isolate`): an IREE crash is an error
line, not the end of the command.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convbw_mlir.cli_args import ArgumentParser, add_problem_arguments, problem_from_args, run_cli, write_output

__all__ = ["main"]

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.M)
_LOC = re.compile(r'"([^"]*)":(\d+):(\d+)')
_CONVBW_OP = re.compile(r'"(convbw\.\w+)"\s*\(')  # a convbw op in generic form (they are unregistered)
_FUNC = re.compile(r"\b(func\.func|util\.func)\b")  # what IREE compiles: a module without one gives no bytecode


class OptError(ValueError):
    """A failure already reported on stderr in full; main() exits with code 1."""


@dataclass
class Diagnostic:
    severity: str  # error, warning, note, remark
    message: str
    line: int | None  # in the input file (split chunks keep the file's numbering)
    col: int | None

    def format(self, filename: str) -> str:
        where = f"{filename}:{self.line}:{self.col}: " if self.line is not None else f"{filename}: "
        return f"{where}{self.severity}: {self.message}"


@dataclass
class DiagnosticCollector:
    """Captures the diagnostics of a context (including notes) as :class:`Diagnostic`."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def _add(self, d: Any, severity: str | None = None) -> None:
        m = _LOC.search(str(d.location))
        line, col = (int(m.group(2)), int(m.group(3))) if m else (None, None)
        sev = severity or str(d.severity).rsplit(".", 1)[-1].lower()
        self.diagnostics.append(Diagnostic(sev, str(d.message), line, col))
        for note in d.notes:
            self._add(note, "note")

    def handler(self, d: Any) -> bool:
        self._add(d)
        return True


# -- expected diagnostics (mlir-opt's --verify-diagnostics) ------------------------------------------
_EXPECT = re.compile(r"//\s*expected-(error|warning|note|remark)\s*(@(?:[+-]\d+|above|below))?\s*\{\{(.*?)\}\}")


@dataclass
class Expectation:
    severity: str
    line: int
    text: str
    where: int  # the line of the comment itself
    matched: bool = False


def _expectations(text: str, first_line: int) -> list[Expectation]:
    out = []
    for i, line in enumerate(text.splitlines()):
        lineno = first_line + i
        for m in _EXPECT.finditer(line):
            sev, offset, msg = m.groups()
            target = lineno
            if offset in ("@above",):
                target = lineno - 1
            elif offset in ("@below",):
                target = lineno + 1
            elif offset:
                target = lineno + int(offset[1:])
            out.append(Expectation(sev, target, msg, lineno))
    return out


def _check_expectations(expected: list[Expectation], got: list[Diagnostic], filename: str) -> list[str]:
    """mlir-opt's rule: every expectation met by a diagnostic of its severity on its line whose
    message contains the text, and every error/warning/note/remark expected."""
    problems = []
    for d in got:
        hit = next(
            (
                e
                for e in expected
                if not e.matched and e.severity == d.severity and e.line == d.line and e.text in d.message
            ),
            None,
        )
        if hit:
            hit.matched = True
        else:
            problems.append(f"{d.format(filename)}  <- unexpected {d.severity}")
    for e in expected:
        if not e.matched:
            problems.append(
                f"{filename}:{e.where}: {e.severity} '{e.text}' was expected on line {e.line} but not produced"
            )
    return problems


# -- running one chunk ----------------------------------------------------------------------------
@dataclass
class Chunk:
    text: str
    first_line: int  # 1-based line of the chunk in the input file


def _split(text: str, split: bool) -> list[Chunk]:
    if not split:
        return [Chunk(text, 1)]
    chunks, start, line = [], 0, 1
    for m in SPLIT_MARKER.finditer(text):
        chunks.append(Chunk(text[start : m.start()], line))
        line += text[start : m.end()].count("\n") + (0 if text[m.end() : m.end() + 1] != "\n" else 1)
        start = m.end() + (1 if text[m.end() : m.end() + 1] == "\n" else 0)
    chunks.append(Chunk(text[start:], line))
    return chunks


def _ir_dump(title: str, module: Any) -> str:
    return f"// -----// IR Dump {title} //----- //\n{module}\n"


def _run_chunk(chunk: Chunk, args: argparse.Namespace, pipeline: list, io: dict) -> tuple[str | None, list[Diagnostic]]:
    """Parse, verify convbw ops, run the pipeline one element at a time. Returns (output IR, diagnostics)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.passes.framework import build_pass_manager, collect_ops, format_pipeline

    collector = DiagnosticCollector()
    ctx = new_context()
    handle = ctx.attach_diagnostic_handler(collector.handler)
    try:
        with ctx:
            # Pad with newlines so that locations keep the input file's line numbers.
            try:
                module = ir.Module.parse("\n" * (chunk.first_line - 1) + chunk.text)
            except ir.MLIRError as e:
                for d in e.error_diagnostics:
                    collector._add(d)
                return None, collector.diagnostics
            # The convbw op is unregistered: run its verifier here, as MLIR would after parsing.
            if not all([convbw.verify_op(op) is not None for op in collect_ops(module.operation, convbw.OP_NAME)]):
                return None, collector.diagnostics
            for i, element in enumerate(pipeline):
                name = str(element)
                if args.mlir_print_ir_before_all or element.argument in args.mlir_print_ir_before:
                    io["stderr"].write(_ir_dump(f"Before {name}", module))
                before = str(module) if not args.verify_diagnostics else None
                try:
                    build_pass_manager([element], ctx).run(module.operation)
                except ir.MLIRError as e:
                    for d in e.error_diagnostics:  # raised with the error rather than sent to handlers
                        collector._add(d)
                    if before is not None:
                        _write_reproducer(args, before, format_pipeline(pipeline[i:]), io)
                    return None, collector.diagnostics
                if args.mlir_print_ir_after_all or element.argument in args.mlir_print_ir_after:
                    io["stderr"].write(_ir_dump(f"After {name}", module))
            # IREE's diagnostics then point into the input file (or the problem) rather than a reprint.
            text = module.operation.get_asm(enable_debug_info=True) if args.emit != "mlir" else str(module)
            return text, collector.diagnostics
    finally:
        handle.detach()


def _write_reproducer(args: argparse.Namespace, ir_text: str, pipeline: str, io: dict) -> None:
    if args.output and args.output != "-":
        path = Path(args.output + ".reproducer.mlir")
    elif args.input and args.input != "-":
        path = Path(Path(args.input).name).with_suffix(".reproducer.mlir")
    else:
        path = Path("convbw-opt.reproducer.mlir")
    if args.reproducer:
        path = Path(args.reproducer)
    command = f"convbw-opt {path} --pass-pipeline='{pipeline}'"
    try:
        write_output(str(path), f"// Reproducer: {command}\n{ir_text}", flag="--reproducer")
    except ValueError as e:  # the pass error it was meant to record is still reported, and exits 1
        io["stderr"].write(f"convbw-opt: error: {e}\n")
        return
    io["stderr"].write(f"convbw-opt: reproducer written to {path}; replay with: {command}\n")


# -- the command ----------------------------------------------------------------------------------
def _list_passes() -> str:
    import typing

    from convbw_mlir.passes import PASSES

    lines = ["convbw passes (use in --pass-pipeline; any MLIR or IREE pass may be mixed in):"]
    for arg, cls in sorted(PASSES.items()):
        lines.append(f"  {arg}")
        lines.append(f"      {cls.description}")
        hints = typing.get_type_hints(cls.Options)
        for f in cls.option_fields():
            t = " | ".join(getattr(a, "__name__", str(a)) for a in (typing.get_args(hints[f.name]) or (hints[f.name],)))
            choices = f" ({'|'.join(f.metadata['choices'])})" if f.metadata.get("choices") else ""
            lines.append(f"      {f.name.replace('_', '-')}={f.default}  [{t}{choices}]  {f.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


def build_parser() -> ArgumentParser:
    from convbw_mlir.targets import TARGETS

    p = ArgumentParser(prog="convbw-opt", description="Run convbw and MLIR passes on IR (mlir-opt style).")
    p.add_argument("input", nargs="?", default=None, help="input .mlir file, - for stdin (or give --ck/--miopen)")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument("--pass-pipeline", help="textual pipeline, e.g. 'builtin.module(convbw-lower-to-linalg,cse)'")
    p.add_argument("--convbw-pipeline", metavar="TARGET", choices=list(TARGETS), help="the named pipeline of a target")
    p.add_argument("--print-pipeline", action="store_true", help="print the pipeline as a replayable string and exit")
    p.add_argument("--split-input-file", action="store_true", help="process chunks separated by '// -----' alone")
    p.add_argument("--verify-diagnostics", action="store_true", help="check expected-error/warning/note comments")
    p.add_argument("--mlir-print-ir-after-all", action="store_true")
    p.add_argument("--mlir-print-ir-before-all", action="store_true")
    p.add_argument("--mlir-print-ir-before", action="append", default=[], metavar="PASS")
    p.add_argument("--mlir-print-ir-after", action="append", default=[], metavar="PASS")
    p.add_argument("--list-passes", action="store_true", help="list the convbw passes with their options")
    p.add_argument("--emit", choices=["mlir", "vmfb", "isa"], default="mlir", help="end with the IREE compile")
    p.add_argument("--target", choices=list(TARGETS), metavar="TARGET", help="target for --emit=vmfb|isa")
    p.add_argument("--reproducer", metavar="PATH", help="where to write the reproducer of a failing pass")
    add_problem_arguments(p)
    p.set_defaults(func=_main)
    return p


def _pipeline(args: argparse.Namespace) -> list:
    from convbw_mlir.passes import parse_pipeline
    from convbw_mlir.pipelines import for_target

    if args.pass_pipeline and args.convbw_pipeline:
        raise ValueError("--pass-pipeline: give --pass-pipeline or --convbw-pipeline, not both")
    if args.convbw_pipeline:
        pipeline = for_target(args.convbw_pipeline)
    else:
        pipeline = parse_pipeline(args.pass_pipeline) if args.pass_pipeline else []
    known = [e.argument for e in pipeline]
    for flag, names in (("--mlir-print-ir-before", args.mlir_print_ir_before),
                        ("--mlir-print-ir-after", args.mlir_print_ir_after)):  # fmt: skip
        for name in names:
            if name not in known:
                listed = ", ".join(dict.fromkeys(known)) or "none (no pipeline given)"
                raise ValueError(f"{flag}: no pass {name!r} in the pipeline; its passes: {listed}")
    return pipeline


def _read_input(args: argparse.Namespace) -> tuple[str, str]:
    """(IR text, file name for diagnostics)."""
    has_problem = args.ck or args.miopen or args.batch is not None
    if has_problem:
        if args.input is not None:
            raise ValueError("input: give an input file or a problem (--ck/--miopen/flags), not both")
        from convbw_mlir.dialects import convbw
        from convbw_mlir.ir_imports import new_context

        with new_context():
            return str(convbw.build_module(problem_from_args(args))), "<problem>"
    if args.input in (None, "-"):
        return sys.stdin.read(), "<stdin>"
    path = Path(args.input)
    if not path.is_file():
        raise ValueError(f"input: {args.input} is not a file")
    return path.read_text(), args.input


def _main(args: argparse.Namespace) -> int:
    io = {"stderr": sys.stderr}
    if args.list_passes:
        sys.stdout.write(_list_passes())
        return 0
    pipeline = _pipeline(args)
    if args.print_pipeline:
        from convbw_mlir.passes import format_pipeline

        print(format_pipeline(pipeline))
        return 0
    target = args.target or args.convbw_pipeline
    if args.emit != "mlir":
        if not target:
            raise ValueError(f"--emit={args.emit}: needs --target (or --convbw-pipeline=<target>)")
        if args.split_input_file or args.verify_diagnostics:
            raise ValueError(f"--emit={args.emit}: does not combine with --split-input-file or --verify-diagnostics")
    text, filename = _read_input(args)
    outputs, failed, problems = [], False, []
    for chunk in _split(text, args.split_input_file):
        out, diags = _run_chunk(chunk, args, pipeline, io)
        if args.verify_diagnostics:
            problems += _check_expectations(_expectations(chunk.text, chunk.first_line), diags, filename)
        else:
            for d in diags:
                io["stderr"].write(d.format(filename) + "\n")
            failed |= out is None
        if out is not None:
            outputs.append(out)
    if problems:
        for line in problems:
            io["stderr"].write(line + "\n")
        return 1
    if args.emit == "mlir" and outputs and (not failed or args.split_input_file):
        # As mlir-opt: with --split-input-file the chunks that passed are still written.
        write_output(args.output, "// -----\n".join(outputs))
    if failed or args.emit == "mlir":
        return int(failed)
    return _emit_compiled(outputs[0], target, filename, args)


def _emit_compiled(ir_text: str, target: str, filename: str, args: argparse.Namespace) -> int:
    from convbw_mlir.build.iree import compile_module, executable_intermediates
    from convbw_mlir.build.isolate import call

    remaining = sorted(set(_CONVBW_OP.findall(ir_text)))
    if remaining:  # IREE does not know them and segfaults on them
        how = f"--convbw-pipeline={target}" if target else "--convbw-pipeline=<target>"
        raise ValueError(f"--emit={args.emit}: the module still holds {', '.join(remaining)} ops; "
                         f"lower them first, e.g. {how}")  # fmt: skip
    if not _FUNC.search(ir_text):  # IREE's own word for it is "failed to generate bytecode"
        raise ValueError(f"--emit={args.emit}: {filename} holds no function to compile (an empty module); "
                         "give a problem: a .mlir file or --ck/--miopen")  # fmt: skip
    if args.emit == "vmfb" and args.output == "-" and sys.stdout.isatty():
        raise ValueError("-o: refusing to write a vmfb to a terminal; give -o FILE")
    what = f"{filename} for {target}"
    # The bindings parse text as file "-": name the input file, so that IREE's errors point into it.
    ir_text = re.sub(r'\bloc\("-":(?=\d)', lambda _: f"loc({json.dumps(filename)}:", ir_text)
    if args.emit == "vmfb":
        write_output(args.output, call(compile_module, ir_text, target, source_name=filename, what=what))
    else:
        write_output(args.output, call(executable_intermediates, ir_text, target, what=what).isa)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli("convbw-opt", build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
