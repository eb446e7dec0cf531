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
import os
import socket
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

__all__ = ["CONNECT_TIMEOUT_S", "ENGINES", "EngineError", "check_engine", "probe_ray_address", "run_tasks", "session",
           "worker_name"]  # fmt: skip

ENGINES = ("local", "ray")
RAY_EXTRA = "pip install 'convbw-mlir[ray]'"
# Seconds a Ray address has to answer before the build gives up: ray.init's own retries take ~12 min (20 tries
# of 35 s in Ray 2.60) on an address where nothing answers, which reads as a hang.
CONNECT_TIMEOUT_S = 10.0
# What an HTTP/2 client sends first (RFC 9113 3.4): the preface and an empty SETTINGS frame. Ray's GCS and its
# client server speak gRPC, so a Ray address answers with a SETTINGS frame of its own; a port of anything else
# (Ray's dashboard, another service) does not, and ray.init would retry it as long as an unreachable one.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0)


class EngineError(RuntimeError):
    """A task the engine lost (a Ray worker that died, a node that left); the message names the task."""


def check_engine(engine: str, address: str | None = None, workers: Any = 1) -> None:
    """Refuse an unknown engine, an address without Ray, a worker count below 1, or Ray where it is not
    installed: before anything starts (a Ray session, a build).

    Raises:
        ValueError: naming the field and the value.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
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
        ValueError: a bad engine, address or worker count (:func:`check_engine`), or no Ray cluster
            answering at ``address`` within :data:`CONNECT_TIMEOUT_S` (:func:`probe_ray_address`).
        Exception: whatever ``fn`` raised (engine local).
    """
    check_engine(engine, address, workers)
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
    ``workers`` CPUs) and shut down after. Nothing for engine local.

    Raises:
        ValueError: a bad engine, address or worker count, or no Ray cluster answering at ``address`` within
            :data:`CONNECT_TIMEOUT_S` (:func:`probe_ray_address`), before Ray is started.
    """
    check_engine(engine, address, workers)
    if engine != "ray":
        yield
        return
    import ray

    if ray.is_initialized():
        yield
        return
    if address is not None:
        probe_ray_address(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as e:  # e.g. auto with no cluster running here
            raise ValueError(f"address: {address!r}: cannot connect to a Ray cluster: {_first_line(e)}") from None
    else:  # no dashboard: its extra processes would take CPUs from the compiles
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _host_port(address: str) -> tuple[str, int] | None:
    """The (host, port) Ray connects to for ``address`` (``host:port``, ``ray://host:port``, ``[v6]:port``, or
    ``auto`` as Ray resolves it); None where Ray finds no address itself (``auto`` with no cluster: ray.init
    says so at once)."""
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address(address) or ""
        except Exception:  # no cluster found, or Ray's private helper moved: ray.init reports it
            return None
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"address: expected a Ray address (host:port, ray://host:port or auto), got {address!r}")
    return host, int(port)


def probe_ray_address(address: str, timeout: float | None = None) -> None:
    """Check that a Ray cluster answers at ``address`` within ``timeout`` seconds (default
    :data:`CONNECT_TIMEOUT_S`): a TCP connection, then an HTTP/2 SETTINGS frame in reply to a client's
    preface (Ray's GCS and its client server are gRPC servers). With ``RAY_USE_TLS`` set only the connection
    is checked (the preface would have to go through TLS).

    Raises:
        ValueError: naming ``address``, its value and what failed (refused, no answer, not a Ray port).
    """
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    where = _host_port(address)
    if where is None:
        return
    why = None
    try:
        with socket.create_connection(where, timeout=timeout) as s:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("0", "", "false"):
                s.sendall(_H2_HELLO)
                head = b""
                while len(head) < 9:
                    chunk = s.recv(9 - len(head))
                    if not chunk:
                        break
                    head += chunk
                if len(head) < 9 or head[3] != 0x04:  # the frame's type byte: SETTINGS
                    why = "it answered, but not as a Ray cluster (no gRPC server there: give the GCS port, e.g. 6379)"
    except TimeoutError:
        why = f"no answer within {timeout:g} s"
    except OSError as e:
        why = e.strerror or type(e).__name__
    if why is not None:
        raise ValueError(f"address: {address!r}: cannot connect to a Ray cluster: {why}")
