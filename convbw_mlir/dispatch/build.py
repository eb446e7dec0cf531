"""Compiling variants: one in process (:func:`compile_variant`), through the cache (:func:`cached_build`),
and many in parallel child processes (:class:`Registry`).

    reg = Registry("sm_80")
    reg.declare_candidates(problem)          # or reg.declare(problem, variant)
    report = reg.build(max_workers=2)        # each variant in its own child: an IREE crash costs one
    print(report.table())                    # kernels x workers -> seconds
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.build.compile import build_op
from convbw_mlir.build.contenders import build_form
from convbw_mlir.build.iree import CompileError
from convbw_mlir.dispatch.cache import KernelCache
from convbw_mlir.dispatch.variants import Variant, candidates, dist_version, known_wrong, request_key, variant_request
from convbw_mlir.limits import check_limits
from convbw_mlir.plan import check_plan
from convbw_mlir.policies import sm90
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target, resolve

__all__ = ["BuildReport", "BuildResult", "Registry", "build_one", "cached_build", "compile_variant", "iree_version"]

# One variant compiles in 0.3-20 s here; past this it is recorded as hung and its child killed.
BUILD_TIMEOUT_S = 600


@cache
def iree_version() -> str:
    """The IREE compiler's version, from its package metadata (importing the compiler costs ~0.1 s)."""
    return dist_version("iree-base-compiler") or "none"


def compile_variant(problem: ConvBwdWeightProblem, target: Target | str, variant: Variant,
                    extra_flags: list[str] | None = None, output_arg: bool = False) -> CompiledOp:  # fmt: skip
    """Compile ``variant`` of ``problem`` in this process (no cache); ``output_arg`` as in compile_op.

    Raises:
        CompileError: a pass or IREE failed, or the form has no IR for this problem.
        ValueError: an IREE form known to compute a wrong dW for this problem (naming the form).
    """
    tgt = resolve(target)
    if variant.form == "convbw":
        check_limits(problem, tgt)
        if variant.plan is not None:
            check_plan(problem, variant.plan)
        return build_op(problem, tgt, variant.plan, extra_flags, output_arg=output_arg)
    wrong = known_wrong(problem, tgt, variant.form)
    if wrong is not None:
        raise ValueError(wrong)
    return build_form(problem, tgt, variant.form, extra_flags, output_arg=output_arg)


def cached_build(problem: ConvBwdWeightProblem, target: Target | str, variant: Variant,
                 cache_root: KernelCache | str | os.PathLike | None = None, extra_flags: list[str] | None = None, *,
                 output_arg: bool = False, isolate: bool = False,
                 timeout: float | None = None) -> tuple[CompiledOp, bool]:  # fmt: skip
    """``(op, hit)``: ``variant`` from the cache ``cache_root`` (a :class:`KernelCache`, its folder, or None:
    the user's), compiled on a miss (in a child process with ``isolate`` or ``extra_flags``: an IREE crash, or
    the abort a bad flag value causes, is a CompileError here)."""
    isolate = isolate or bool(extra_flags)  # IREE ends the compiling process on some flag values
    tgt = resolve(target)
    kc = cache_root if isinstance(cache_root, KernelCache) else KernelCache(cache_root)
    request = variant_request(problem, tgt, variant, iree_version(), extra_flags, output_arg=output_arg)
    key = request_key(request)
    args = (problem, tgt, variant, extra_flags, output_arg)

    def build() -> CompiledOp:
        if not isolate:
            return compile_variant(*args)
        from convbw_mlir.build.isolate import call

        return call(compile_variant, *args, what=f"{problem.name} for {tgt.name} ({variant.name})", timeout=timeout)

    return kc.get_or_build(key, build, variant.to_dict(), request)


@dataclass
class BuildResult:
    """One declared variant after :meth:`Registry.build`: its op, or why not."""

    problem: ConvBwdWeightProblem
    variant: Variant
    op: CompiledOp | None = None
    error: str = ""
    seconds: float = 0.0
    hit: bool = False
    worker: str = ""  # host:pid of the process that ran the task (a thread here, or a Ray worker)

    @property
    def ok(self) -> bool:
        return self.op is not None


@dataclass
class BuildReport:
    """What :meth:`Registry.build` did: a result per variant, the workers and the wall time."""

    results: list[BuildResult]
    workers: int
    wall_s: float
    host: str = field(default_factory=lambda: f"{os.cpu_count()} CPUs")
    engine: str = "local"

    def table(self) -> str:
        """The compile-time table: kernels x workers -> seconds (as CK Tile's dispatcher reports it)."""
        ok = sum(r.ok for r in self.results)
        hits = sum(r.hit for r in self.results)
        cpu = sum(r.seconds for r in self.results)
        lines = [
            "| kernels | built | cache hits | failed | engine | workers | wall s | sum of compile s | host |",
            "|---:|---:|---:|---:|---|---:|---:|---:|---|",
            f"| {len(self.results)} | {ok - hits} | {hits} | {len(self.results) - ok} | {self.engine} "
            f"| {self.workers} | {self.wall_s:.1f} | {cpu:.1f} | {self.host} |",
        ]
        failed = [r for r in self.results if not r.ok]
        if failed:
            lines += ["", "| problem | variant | error |", "|---|---|---|"]
            lines += [f"| {r.problem.name} | {r.variant.name} | {r.error} |" for r in failed]
        return "\n".join(lines)


class Registry:
    """Declared variants of problems for one target, built in parallel child processes.

    Args:
        target: the target name.
        cache: the kernel cache (a :class:`KernelCache`, a folder, or None: the user's).

    Raises:
        ValueError: unknown target.
    """

    def __init__(self, target: str, cache: KernelCache | str | os.PathLike | None = None) -> None:
        self.target = resolve(target).name
        self.cache = cache if isinstance(cache, KernelCache) else KernelCache(cache)
        self.declared: list[tuple[ConvBwdWeightProblem, Variant]] = []

    def declare(self, problem: ConvBwdWeightProblem, variant: Variant) -> None:
        """Add one variant (a :class:`Variant` whose plan, if any, is for this registry's target)."""
        if variant.plan is not None and variant.plan.target != self.target:
            raise ValueError(f"variant: its plan is for {variant.plan.target}, the registry for {self.target}")
        if (problem, variant) not in self.declared:
            self.declared.append((problem, variant))

    def declare_candidates(self, problem: ConvBwdWeightProblem, **kwargs: Any) -> list[Variant]:
        """Declare :func:`convbw_mlir.dispatch.variants.candidates` of ``problem``; returns them."""
        found = candidates(problem, self.target, **kwargs)
        for v in found:
            self.declare(problem, v)
        return found

    def build(self, max_workers: int = 2, timeout: float = BUILD_TIMEOUT_S, progress: bool | None = None,
              engine: str = "local", address: str | None = None) -> BuildReport:  # fmt: skip
        """Compile every declared variant, ``max_workers`` child processes at a time, through the cache.

        A variant whose compile fails, crashes IREE (a signal) or runs past ``timeout`` seconds is
        recorded with its reason; the others go on. ``progress``: a tqdm bar (default: on a terminal).
        ``engine``: ``local`` (threads here) or ``ray`` (a Ray task a variant, on a local Ray of
        ``max_workers`` CPUs or the cluster at ``address``): :func:`convbw_mlir.dispatch.engine.run_tasks`.

        Raises:
            ValueError: ``max_workers`` below 1, an unknown engine, an address without Ray.
        """
        from tqdm import tqdm

        from convbw_mlir.dispatch.engine import run_tasks

        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers: expected a positive integer, got {max_workers!r}")
        self.cache._setup()  # tagged once here: tasks creating one new cache at once read each other's half-written tag
        jobs = [(p, self.target, v, self.cache, timeout) for p, v in self.declared]
        show = sys.stderr.isatty() if progress is None else progress
        t0 = time.perf_counter()
        results: dict[int, BuildResult] = {}
        bar = tqdm(total=len(self.declared), disable=not show, desc=f"build {self.target}", unit="kernel")
        with bar:
            for i, r in run_tasks(build_one, jobs, engine, max_workers, address):
                if not isinstance(r, BuildResult):  # a task the engine lost: that variant only
                    problem, variant = self.declared[i]
                    r = BuildResult(problem, variant, error=str(r))
                results[i] = r
                bar.update()
                if not r.ok:
                    bar.write(f"failed: {r.problem.name} {r.variant.name}: {r.error}")
        wall = time.perf_counter() - t0
        return BuildReport([results[i] for i in range(len(self.declared))], max_workers, wall, engine=engine)


def direct_only(variant: Variant) -> bool:
    """Whether only the direct CUDA launch runs ``variant`` (the sm_90a kernel's TMA maps): it is built with an
    output argument (x, dy, dW), the ABI the launcher binds (:class:`convbw_mlir.measure.run.DirectKernel`)."""
    return variant.plan is not None and sm90.is_sm90(variant.plan)


def build_one(problem: ConvBwdWeightProblem, target: str, variant: Variant, cache: KernelCache,
              timeout: float | None) -> BuildResult:  # fmt: skip
    """One variant through the cache, compiled in a child process: a task of :meth:`Registry.build`."""
    from convbw_mlir.build.isolate import call
    from convbw_mlir.dispatch.engine import worker_name

    t0 = time.perf_counter()
    res = BuildResult(problem, variant, worker=worker_name())
    try:
        what = f"{problem.name} {variant.name} for {target}"
        res.op, res.hit = call(cached_build, problem, target, variant, cache, what=what, timeout=timeout,
                               output_arg=direct_only(variant))  # fmt: skip
    except (CompileError, ValueError) as e:
        res.error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    res.seconds = time.perf_counter() - t0
    return res
