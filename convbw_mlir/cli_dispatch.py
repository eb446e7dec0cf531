"""``convbw tune``, ``convbw cache {info,clear}``, ``convbw select``: the dispatcher's commands.

convbw tune --suite seeds --suite models --target sm_80 --compile-only --out DIR   # build half
convbw tune ... --compile-only --engine ray [--address HOST:PORT] --out DIR         # its compiles as Ray tasks
python -m convbw_mlir.dispatch.tune DIR --out DIR/results.json [--devices 0,1]    # timing half (runtime)
convbw tune --import DIR/results.json                                             # into your database
convbw select --ck "2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1" --target sm_80
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from convbw_mlir.cli_args import add_problem_arguments, add_request_arguments, int_at_least, problem_from_args
from convbw_mlir.measure.pool import DEVICES_HELP
from convbw_mlir.problem import DTYPES, ConvBwdWeightProblem

__all__ = ["add_dispatch_commands", "read_problem_lines"]

# What a database folder (--into) may hold: databases (db.db_file_name) and their temporaries (files.write_atomic).
DB_NAME_RE = re.compile(r"[a-z0-9-]+\.[\w-]+\.json|\..+\.json\.\w+\.tmp")
TRUST = ("A kernel (.vmfb) is native code that the runtime executes: build, time and import only from a "
         "trusted source. A database holds plans, not kernels, and names no files.")  # fmt: skip


def read_problem_lines(path: str, dtype: str) -> list[tuple[str, ConvBwdWeightProblem]]:
    """A model's layer list: one ckProfiler or MIOpenDriver line each (``#`` comments, optional ``name<TAB>``).

    Raises:
        ValueError: a line that parses as neither (with its number).
    """
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, _, args = text.rpartition("\t")
        try:
            if args.lstrip().startswith("conv"):
                p = ConvBwdWeightProblem.from_miopen(args)
            else:
                p = ConvBwdWeightProblem.from_ck(args, dtype=dtype)
        except ValueError as e:
            raise ValueError(f"--problems: {path}:{i}: {e}") from None
        out.append((name or p.name, p))
    return out


def _problems(args: argparse.Namespace) -> list[tuple[str, ConvBwdWeightProblem, bool]]:
    from convbw_mlir.dispatch.tune import held_out
    from convbw_mlir.suites import load_suite

    out = []
    for dtype in args.types.split(","):
        if dtype not in DTYPES:
            raise ValueError(f"--types: unknown element type {dtype!r}; known: {', '.join(DTYPES)}")
        for suite in args.suite or []:
            out += [(n, p, held_out(i) and not args.no_hold_out) for i, (n, p) in enumerate(load_suite(suite, dtype))
                    if args.filter in n]  # fmt: skip
        for path in args.problems or []:
            out += [(n, p, False) for n, p in read_problem_lines(path, dtype) if args.filter in n]
    if not out:
        raise ValueError("tune: no problems (give --suite, --problems or --import)")
    return out


def _cmd_tune(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch import tune
    from convbw_mlir.dispatch.cache import KernelCache
    from convbw_mlir.dispatch.db import DatabaseError, TuningDB, db_file_name
    from convbw_mlir.files import check_output, claim_folder, record_output

    if args.import_:
        db = _read_import(Path(args.import_))
        into = Path(args.into) if args.into else KernelCache().tuning_dir()
        claim_folder(into, "--into", DB_NAME_RE.fullmatch)
        dest = into / db_file_name(db.device, db.target)  # from checked fields only: inside ``into``
        if dest.exists():  # a bad existing file is refused, never overwritten: it is the user's
            try:
                old = TuningDB.load(dest, strict=True)
            except DatabaseError as e:
                raise ValueError(f"--import: cannot merge into {dest}, fix or move it: {e}") from None
            taken = old.merge(db)
            db = old
        else:
            taken = len(db.entries)
        db.save(dest)
        print(f"imported {taken} entries into {dest} ({len(db.entries)} in all)")
        return 0
    if args.out is None:
        raise ValueError("tune: --out DIR is required to build")
    check_output(args.out)  # before the build: a folder of the user's is refused, not replaced
    from convbw_mlir.dispatch.engine import check_engine

    check_engine(args.engine, args.address, args.workers)  # before the problems are read: one line, nothing built
    if args.cubin:  # ptxas's cubins for the CUDA kernels (build/cubin.py); its children inherit the variable
        from convbw_mlir.build import cubin
        from convbw_mlir.targets import get_target

        if get_target(args.target).driver != "cuda":
            raise ValueError(f"--cubin: cubins are CUDA kernels; --target {args.target} is not a CUDA target")
        os.environ[cubin.PTXAS_ENV] = cubin.ptxas(cubin.requested() or "1")  # no ptxas: one line, nothing built
    problems = _problems(args)
    devices = None
    if not args.compile_only:  # the devices the timing half will use, checked before the build
        from convbw_mlir.measure.pool import parse_devices, resolve_devices
        from convbw_mlir.targets import get_target

        devices = parse_devices(args.devices) if args.devices is not None else None
        resolve_devices(get_target(args.target).driver, devices)
    elif args.devices is not None or args.server:
        flag = "--devices" if args.devices is not None else "--server"
        raise ValueError(f"{flag}: the timing half's; --compile-only times nothing")
    tune.compile_candidates(problems, args.target, args.out, max_workers=args.workers, max_plans=args.max_plans,
                            engine=args.engine, address=args.address)  # fmt: skip
    print(f"built {len(problems)} problems' candidates for {args.target} into {args.out} (manifest.json)")
    if args.compile_only:
        return 0
    results_path = Path(args.out) / "results.json"
    results = tune.time_candidates(args.out, results_path, devices=devices, server=args.server)
    db = tune.build_database(results)
    db.save(Path(args.out) / db_file_name(db.device, db.target))
    results_path.with_suffix(".md").write_text(tune.summarize(results, db))
    record_output(args.out, results_path.name, results_path.with_suffix(".md").name, db_file_name(db.device, db.target))
    return _cmd_tune(argparse.Namespace(import_=str(results_path), into=args.into))


def _read_import(src: Path) -> Any:
    """The database ``--import`` merges: a database file, or a timing results file turned into one.

    Raises:
        ValueError: the file cannot be read, is not JSON, or is neither (naming it and what is wrong).
    """
    from convbw_mlir.dispatch import tune
    from convbw_mlir.dispatch.db import DatabaseError, TuningDB

    try:
        text = src.read_bytes()
    except OSError as e:
        raise ValueError(f"--import: cannot read {src}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--import: {src}: not JSON ({e})") from None
    try:
        if isinstance(data, dict) and "kind" in data:
            return TuningDB.parse(text, str(src))
        return tune.database_from_results(data, str(src))
    except DatabaseError as e:
        raise ValueError(f"--import: {e}") from None


def _cmd_cache(args: argparse.Namespace) -> int:
    from convbw_mlir.dispatch.cache import KernelCache

    kc = KernelCache(args.cache_dir)  # info and clear check the folder is the cache, and create nothing
    if args.action == "info":
        info = kc.info()
        where = f"{info.root}" if info.root.exists() else f"{info.root} (not created yet)"
        print(f"cache: {where}\nentries: {info.entries}\nbytes: {info.bytes} (limit {info.max_bytes})")
    else:
        removed = kc.clear()
        print(f"removed {removed} entries and {kc.verdicts_cleared} switch verdicts from {kc.root}")
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    import time

    from convbw_mlir.dispatch.select import databases, select

    problem = problem_from_args(args)
    dbs = databases(args.target, args.device, args.db)
    t0 = time.perf_counter()
    sel = select(problem, args.target, args.device, dbs=dbs, deterministic=args.deterministic,
                 max_workspace_bytes=args.max_workspace_bytes)  # fmt: skip
    dt = time.perf_counter() - t0
    print(f"problem: {problem.to_ck()} ({problem.dtype})")
    print(f"variant: {sel.variant.name}")
    print(f"path: {sel.path} ({sel.why})")
    if sel.variant.plan is not None:
        plan = sel.variant.plan
        print(f"plan: {json.dumps(plan.to_dict())}")
        print(f"workspace: {plan.workspace_bytes} bytes, {'' if plan.deterministic else 'not '}deterministic")
        print("\n".join(plan.decision.lines() if plan.decision is not None else ["rule: none recorded"]))
    else:
        print(f"rule: none (IREE's own form {sel.variant.name}, no plan of ours: chosen by path {sel.path})")
    print(f"select took {dt * 1e3:.3f} ms")
    return 0


def add_dispatch_commands(sub: Any) -> None:
    """Add ``tune``, ``cache`` and ``select`` to the ``convbw`` subcommands ``sub``."""
    from convbw_mlir.targets import TARGETS

    tune = sub.add_parser("tune", help="build, time and select kernel variants; write a tuning database",
                          description=TRUST)  # fmt: skip
    tune.add_argument("--suite", action="append", help="shipped suite name or .tsv path")
    tune.add_argument("--problems", action="append", help="a layer list: ckProfiler or MIOpenDriver lines")
    tune.add_argument("--target", default="sm_80", choices=list(TARGETS), metavar="TARGET")
    tune.add_argument("--types", default="f16", help="comma-separated element types")
    tune.add_argument("--filter", default="", help="only problems whose name contains this")
    tune.add_argument("--workers", type=int_at_least(1), default=2, help="parallel compile processes (default 2)")
    tune.add_argument("--engine", default="local", choices=["local", "ray"],
                      help="where the compiles run: here (local, the default) or as Ray tasks (ray: pip install "
                           "'convbw-mlir[ray]'; a local Ray of --workers CPUs unless --address)")  # fmt: skip
    tune.add_argument("--address", default=None, help="with --engine ray: the Ray cluster to join (host:port or auto)")
    tune.add_argument(
        "--max-plans", type=int_at_least(0), default=4, help="plan variants per problem beside the heuristic's"
    )
    tune.add_argument("--no-hold-out", action="store_true", help="tune every suite problem (none held out)")
    tune.add_argument("--compile-only", action="store_true", help="build the candidates into --out, time nothing")
    tune.add_argument("--out", help="candidate folder (manifest.json + kernels)")
    tune.add_argument("--devices", default=None, help=DEVICES_HELP)
    tune.add_argument(
        "--server",
        action="store_true",
        help="time through one measuring process a GPU: candidates checked once, timed in batches",
    )
    tune.add_argument("--cubin", action="store_true",
                      help="CUDA kernels as ptxas's cubins, not PTX (no JIT at load; needs ptxas: pip install "
                           "'convbw-mlir[cubin]', or $CONVBW_PTXAS = its path)")  # fmt: skip
    tune.add_argument("--import", dest="import_", metavar="FILE",
                      help="merge a database or a timing results.json into yours (trusted sources only)")  # fmt: skip
    tune.add_argument("--into", help="database folder for --import (default <cache>/tuning)")
    tune.set_defaults(func=_cmd_tune)
    cache = sub.add_parser("cache", help="the kernel cache: info or clear")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--cache-dir", default=None, help="default $CONVBW_CACHE_DIR or the platform's cache folder")
    cache.set_defaults(func=_cmd_cache)
    sel = sub.add_parser("select", help="print the variant chosen for a problem and why")
    add_problem_arguments(sel)
    add_request_arguments(sel)
    sel.add_argument("--target", default="sm_80", choices=list(TARGETS), metavar="TARGET")
    sel.add_argument("--device", default=None, help="device name: only its database")
    sel.add_argument("--db", action="append",
                     help="a database file consulted first, over yours and the shipped ones (repeatable)")  # fmt: skip
    sel.set_defaults(func=_cmd_select)
