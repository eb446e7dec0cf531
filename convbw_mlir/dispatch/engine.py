"""Where the dispatcher's build tasks run: threads of this process (``local``) or tasks of a Ray cluster (``ray``).

Each task is one (problem, variant) compile (or one problem's GPU reference) that starts its own child process
(:mod:`convbw_mlir.build.isolate`), so an IREE crash costs that task only, on either engine. Results come back
to the caller, who writes every artifact: a Ray worker writes nothing outside its kernel cache, so a build on
a cluster fills the same output folder, with the same bytes, as one on this machine (docs/dispatch.md#ray).

    for i, result in run_tasks(fn, [(a, b), (c, d)], engine="ray", workers=2):
        ...                                  # in completion order; ``i`` indexes the jobs
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

__all__ = ["ENGINES", "EngineError", "check_engine", "run_tasks", "session", "worker_name"]

ENGINES = ("local", "ray")
RAY_EXTRA = "pip install 'convbw-mlir[ray]'"


class EngineError(RuntimeError):
    """A task the engine lost (a Ray worker that died, a node that left); the message names the task."""


def check_engine(engine: str, address: str | None = None) -> None:
    """Refuse an unknown engine, an address without Ray, or Ray where it is not installed.

    Raises:
        ValueError: naming the field and the value.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if address is not None and engine != "ray":
        raise ValueError(f"address: {address!r} applies to engine ray only (engine: {engine})")
    if address is not None and not (isinstance(address, str) and address.strip()):
        raise ValueError(f"address: expected a Ray address (host:port, ray://host:port or auto), got {address!r}")
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError(f"engine: ray needs Ray, which is not installed ({RAY_EXTRA})") from None


def run_tasks(fn: Callable[..., Any], jobs: list[tuple], engine: str = "local", workers: int = 2,
              address: str | None = None) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """``fn(*job)`` for every job, ``(index, result)`` in completion order; the result of a task Ray lost
    (its worker died, its node left, or ``fn`` raised there) is an :class:`EngineError` naming it; the
    others go on.

    Args:
        fn: a module-level function (Ray pickles it by reference for its workers).
        jobs: the argument tuples.
        engine: ``local`` (``workers`` threads here, each waiting on its child process) or ``ray``
            (a task of ``num_cpus=1`` each; without ``address`` a local Ray of ``workers`` CPUs is started
            for this call and stopped after it, with ``address`` the cluster's CPUs set the parallelism).
        address: the Ray cluster to join (``ray.init(address=...)``), for engine ray only.

    Raises:
        ValueError: a bad engine, address or worker count (:func:`check_engine`).
        Exception: whatever ``fn`` raised (engine local).
    """
    check_engine(engine, address)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    if engine == "local":
        with ThreadPoolExecutor(workers) as pool:
            futures = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        return
    with session(engine, workers, address):
        yield from _ray_tasks(fn, jobs)


def worker_name() -> str:
    """Where a task runs: ``host:pid`` (a build result records it; the scaling bench counts the workers)."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _ray_tasks(fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[tuple]:
    import ray

    remote = ray.remote(num_cpus=1, max_retries=0)(fn)  # a retry would compile a crashing variant again
    pending = {remote.remote(*job): i for i, job in enumerate(jobs)}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayError as e:
                cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                result = EngineError(f"ray lost task {i} ({fn.__name__}): {cause}")
            yield i, result
    finally:
        for ref in pending:  # a caller that stopped early: nothing keeps compiling for nobody
            ray.cancel(ref, force=True)


@contextlib.contextmanager
def session(engine: str, workers: int = 2, address: str | None = None) -> Iterator[None]:
    """For engine ray, a Ray session around several :func:`run_tasks` calls (Ray starts in ~5 s here):
    the caller's if Ray is already initialised, else one started here (on ``address``, or a local Ray of
    ``workers`` CPUs) and shut down after. Nothing for engine local."""
    check_engine(engine, address)
    if engine != "ray":
        yield
        return
    import ray

    if ray.is_initialized():
        yield
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:  # no dashboard: its extra processes would take CPUs from the compiles
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
