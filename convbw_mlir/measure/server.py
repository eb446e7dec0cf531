"""A timing path for tuning: one persistent measuring process a GPU, candidates checked once, timed in batches.

``measure.run`` starts a child per problem: process start, imports, CUPTI's first session and the float64
references cost ~20 s a problem (issue 39: 4.5 problems a minute a GPU). Here (``measure.run --server``):

- the parent's CPU workers (:data:`PREP_WORKERS`, spawned) make each problem's x and dy and its float64
  reference (the sample, and numpy's whole dW where cheap) ahead of the GPU, into a folder per problem;
- one **server** a GPU (a child pinned to it) takes the problems one after the other: it loads each candidate
  once, checks it once (NaN after x and dy, float64, as ``measure.run``), then times every correct one in one
  batch holding the device's timing lock (:mod:`convbw_mlir.measure.gpu_lock`): each candidate's wall-clock
  batches (median, spread), then its GPU time by CUPTI after a warm call, as ``measure.run``'s children
  (:class:`ServerTiming`; docs/timing.md#servergap);
- the parent supervises it: a candidate that raises, kills the server or hangs (no event for ``timeout_s``)
  is recorded (``failed``/``crashed``, as ``measure.run``), the server restarts (a device fault poisons its
  process) and resumes at the problem's next candidate.

Rows are those of ``measure.run`` (same fields); the results name the timing protocol (:class:`ServerTiming`)
and how many servers ran. Runtime only, like ``measure.run``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import gc
import json
import multiprocessing
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from convbw_mlir.measure import checks, gpu_lock
from convbw_mlir.measure.children import death, first_line, status_of
from convbw_mlir.measure.records import ManifestEntry, ResultRow
from convbw_mlir.problem import ConvBwdWeightProblem, numpy_dtype

__all__ = ["PREP_WORKERS", "ServerTiming", "Served"]

# CPU workers making inputs and float64 references ahead of the GPU: numpy's reference of a tuning-size problem
# takes about a second, a GPU's batch of candidates about as long.
PREP_WORKERS = max(1, min(8, (os.cpu_count() or 2) - 2))
# Problems prepared ahead of the one measured, a device: enough to keep every CPU worker busy, few enough that
# their inputs (saved to disk) stay small.
LOOKAHEAD = 2
# A server's start (imports, torch's context, CUPTI's first session) may take this long whatever the step timeout.
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServerTiming:
    """How the server times each correct candidate (recorded with the results).

    Wall clock: ``warmup`` calls, then batches of about ``batch_seconds`` each ended by a read-back, at
    least ``min_reps`` batches and ``min_seconds`` (``median_s``, ``p10_s``, ``p90_s``). GPU time: ``cupti_calls``
    back-to-back calls in one CUPTI session shared by the problem's candidates (``kernel_s``, what the tuner
    ranks by). Shorter than ``measure.run``'s (20 batches of 25 ms, 0.2 s): at 60 problems a minute a problem
    has a second for all its candidates.

    ``kernel_each``: each candidate's GPU time is taken right after its own wall-clock batches, in a CUPTI session
    of its own that starts with a warm call (``cupti.kernel_seconds``, as ``measure.run``'s children); False: the
    former order (every candidate's wall clock, then one session for all, no warm call). ``quiet_host``: the CPU
    workers run at the lowest priority (nice 19), so that their float64 references never delay the server's
    launches. Both on by default since issue 39's server gap (docs/timing.md#servergap); off reproduces the
    protocol that measured it.
    """

    warmup: int = 2
    batch_seconds: float = 5e-3
    min_reps: int = 10
    min_seconds: float = 0.05
    cupti_calls: int = 20
    kernel_each: bool = True
    quiet_host: bool = True

    def __post_init__(self) -> None:
        for name in ("kernel_each", "quiet_host"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected True or False, got {getattr(self, name)!r}")
        for name in ("warmup", "min_reps", "cupti_calls"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= (0 if name == "warmup" else 1)):
                raise ValueError(f"{name}: expected a count >= {0 if name == 'warmup' else 1}, got {value!r}")
        for name in ("batch_seconds", "min_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected seconds > 0, got {getattr(self, name)!r}")


# ----------------------------------------------------------------------------------------------------------
# The CPU side: inputs and float64 references, in the parent's workers


def _files(state: Path) -> tuple[Path, Path]:
    return state / "x.bin", state / "dy.bin"


def prepare(problem: dict[str, Any], state: str, numpy_max_flops: float) -> None:
    """x, dy and the float64 checks of ``problem`` into ``state`` (a CPU worker's task; the server reads them)."""
    from convbw_mlir.reference import random_inputs

    p = ConvBwdWeightProblem.from_dict(problem)
    x, dy = random_inputs(p, seed=checks.INPUT_SEED)
    folder = Path(state)
    checks._Problem(p, folder, numpy_max_flops, (x, dy))  # writes check.npz: the sample, numpy's whole dW where cheap
    for arr, path in zip((x, dy), _files(folder)):
        arr.tofile(path.with_suffix(".tmp"))  # raw bytes: bf16 has no .npy type
        path.with_suffix(".tmp").replace(path)  # whole or absent


def _quiet_worker() -> None:
    """A CPU worker's start under ``ServerTiming.quiet_host``: the lowest priority, so that a timing's launches
    (the server's thread) always get a core first."""
    os.nice(19 - os.nice(0))


def _load_inputs(p: ConvBwdWeightProblem, state: Path) -> tuple[np.ndarray, np.ndarray]:
    x_path, dy_path = _files(state)
    x = np.fromfile(x_path, dtype=numpy_dtype(p.dtype)).reshape(p.x_shape)
    return x, np.fromfile(dy_path, dtype=numpy_dtype(p.dy_type)).reshape(p.dy_shape)


# ----------------------------------------------------------------------------------------------------------
# The server: a child pinned to one device


class _Restart(Exception):
    """A candidate raised: its result is recorded; the server ends so that the next one gets a fresh process."""


@dataclass
class _Timed:
    """A checked candidate, ready to be timed: ``sync(call())`` runs it once and waits for the device."""

    call: Callable[[], Any]
    sync: Callable[[Any], Any]
    result: dict[str, Any]


def _wall_times(t: _Timed, timing: ServerTiming) -> list[float]:
    """Seconds a call, one figure a batch (``runtime.time_calls``'s method with :class:`ServerTiming`'s sizes)."""
    from convbw_mlir.runtime import MAX_BATCH

    for _ in range(timing.warmup):
        t.sync(t.call())
    t0 = time.perf_counter()
    t.sync(t.call())
    batch = max(1, min(MAX_BATCH, round(timing.batch_seconds / max(time.perf_counter() - t0, 1e-9))))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < timing.min_reps or time.perf_counter() - start < timing.min_seconds:
        t0 = time.perf_counter()
        for _ in range(batch):
            out = t.call()
        t.sync(out)
        samples.append((time.perf_counter() - t0) / batch)
    return samples


def _check_candidate(folder: Path, prob: Any, rec: dict, driver: str, device: int | None,
                     phases: dict[str, float] | None = None) -> _Timed | dict[str, Any]:  # fmt: skip
    """Load one candidate and check it once (as ``measure.run``): ready to time where correct, else its result."""
    res, loaded = checks.load_checked(folder, prob, rec, driver, device, phases)
    if loaded is None:
        return res
    kernel, xd, dyd = loaded
    return _Timed(lambda: kernel(xd, dyd), lambda r: r.to_host(), res)


def _check_cudnn(prob: Any, torch_: Any) -> _Timed | dict[str, Any]:
    """cuDNN through torch, checked once (its algorithm search holds the device alone, as ``measure.run``)."""
    if torch_ is None:
        return {"status": "n/a", "error": "no CUDA torch"}
    why = torch_.supports(prob.p)
    if why:
        return {"status": "n/a", "error": why}
    lock = gpu_lock.for_device("cuda", 0)
    with lock.shared():
        call, to_ours = torch_.prepare(prob.p, prob.x, prob.dy)
        with lock.timing():
            dw = call()
            torch_.sync()
        got = to_ours(dw)
    res = prob.check(got, prob.p.dw_dtype)
    return _Timed(call, lambda _: torch_.sync(), res) if res["status"] == "ok" else res


def _release() -> None:
    """Free what the last problem left in reference cycles (its kernels, device buffers), then move every survivor
    out of later collections (:func:`gc.freeze`): a problem's collection scans what it allocated, not the server's
    long-lived objects (docs/timing.md, ``free_s``)."""
    gc.collect()
    gc.freeze()


class _Server:
    """The child's state: the device, torch (cuDNN) and CUPTI, opened once for every problem."""

    def __init__(self, options: dict[str, Any], emit: Callable[..., None]) -> None:
        from convbw_mlir.measure import cupti

        self.options, self.emit = options, emit
        self.driver, self.device = options["driver"], options["device"]
        self.timing = ServerTiming(**options["timing"])
        self.lock = gpu_lock.for_device(self.driver, self.device or 0)
        self.start_phases: dict[str, float] = {}  # where the server's start went (sent with ``ready``)
        self.phases: dict[str, Any] = {}  # the current problem's (:meth:`problem`)
        clock = checks._Clock(self.start_phases)
        numpy_dtype("bf16")  # ml_dtypes' first import (~1 s on a busy CPU): the start's, not the first problem's
        clock.lap("imports_s")
        with self.lock.shared():  # torch's CUDA context and CUPTI's first session (seconds): once a server
            self.torch = checks._torch() if options["use_torch"] and self.driver == "cuda" else None
            clock.lap("torch_s")
            self.cupti = self.driver == "cuda" and cupti.available()
            if self.cupti:
                cupti.warm_up()
            clock.lap("cupti_s")
        self.name = self.torch.name if self.torch else self.driver
        gc.freeze()  # the start's objects (torch, CUPTI, numpy) out of every problem's collection (_release)

    def problem(self, cmd: dict[str, Any]) -> None:
        """Check the candidates ``cmd["names"]`` of one problem, then time the correct ones in one batch."""
        folder, state, entry = Path(cmd["folder"]), Path(cmd["state"]), ManifestEntry.from_dict(cmd["entry"])
        # seconds of each step (off the timed region): sent with ``done``, the row's ``phases`` (docs/timing.md)
        phases: dict[str, Any] = {}
        self.phases = phases
        clock = checks._Clock(phases)
        p = entry.conv()
        flops = cmd.get("numpy_max_flops", self.options["numpy_max_flops"])  # a pooled server's run may differ
        prob = checks._Problem(p, state, flops, _load_inputs(p, state))
        clock.lap("inputs_s")
        ready: dict[str, _Timed] = {}
        for name in cmd["names"]:
            self.emit(event="start", name=name)
            each: dict[str, float] = {}
            try:
                if name == "reference":
                    res: Any = checks._run_reference(folder, prob, entry.contenders.get("reference", {}),
                                              self.driver, self.device)  # fmt: skip
                    prob.save()  # a restarted server reads the GPU reference's verdict and dW
                    clock.lap("reference_s")
                elif name == "cudnn":
                    res = _check_cudnn(prob, self.torch)
                    clock.lap("cudnn_check_s")
                else:
                    res = _check_candidate(folder, prob, entry.contenders[name], self.driver, self.device, each)
                    clock.lap("candidates_s")
            except Exception as e:  # noqa: BLE001 - recorded; the next candidate runs in a fresh server
                self.emit(event="result", name=name, result={"status": status_of(e), "error": first_line(e)})
                raise _Restart from None
            for key, seconds in each.items():
                phases[key] = phases.get(key, 0.0) + seconds
            if "load_s" in each:
                phases.setdefault("load_each_s", {})[name] = each["load_s"]
            if isinstance(res, _Timed) and not self.options["check_only"]:
                ready[name] = res
            else:
                self.emit(event="result", name=name, result=res.result if isinstance(res, _Timed) else res)
        if ready:
            self._time(ready)
        clock.lap("timing_s")
        res = None
        with self.lock.shared():  # freeing the kernels and buffers is GPU work too
            ready.clear()
            _release()
            if self.torch is not None:
                self.torch.sync()
        clock.lap("free_s")
        self.emit(event="done", phases=phases)

    def _time(self, ready: dict[str, _Timed]) -> None:
        """Every candidate of ``ready`` timed with the device held alone; a fault is the running one's."""
        from convbw_mlir.measure import cupti

        running = [""]

        def start(name: str) -> None:
            running[0] = name
            self.emit(event="start", name=name)

        try:
            with self.lock.timing():
                t0 = time.perf_counter()
                for name, t in ready.items():
                    start(name)
                    t.result |= checks._stats(_wall_times(t, self.timing))
                    if self.cupti and self.timing.kernel_each:
                        t.result |= self._kernel_time(t)
                self.phases["timing_wall_s"] = time.perf_counter() - t0  # with kernel_each: the CUPTI sessions too
                if self.cupti and not self.timing.kernel_each:
                    calls = {n: (t.call, t.sync) for n, t in ready.items()}
                    try:
                        each = cupti.kernel_seconds_each(calls, self.timing.cupti_calls, before=start)
                    except Exception as e:
                        if status_of(e) == "crashed":
                            raise
                        # the wall-clock figures stand; only the kernel times are missing
                        each = {n: {"kernel_time_error": first_line(e)} for n in ready}
                    for name, fields in each.items():
                        ready[name].result |= fields
        except Exception as e:  # noqa: BLE001 - the running candidate's; the others are timed again afresh
            self.emit(event="result", name=running[0], result={"status": status_of(e), "error": first_line(e)})
            raise _Restart from None
        for name, t in ready.items():
            self.emit(event="result", name=name, result=t.result)

    def _kernel_time(self, t: _Timed) -> dict[str, Any]:
        """``t``'s GPU time as ``measure.run``'s children take it: a warm call, then ``cupti_calls`` calls in a
        session of their own; a CUPTI failure is recorded, a device fault raised (the running candidate's)."""
        from convbw_mlir.measure import cupti

        try:
            return cupti.kernel_seconds(t.call, t.sync, self.timing.cupti_calls)
        except Exception as e:
            if status_of(e) == "crashed":
                raise
            return {"kernel_time_error": first_line(e)}  # the wall-clock figures stand


def _serve(options: dict[str, Any], events_fd: int) -> None:
    """The server's life: ready, then one problem a command line on stdin, until ``quit``, EOF or a restart.

    Ends with an ``exit`` event, then waits for stdin's end: the parent reaps it under the device's shared turn
    (its exit frees device memory: :func:`convbw_mlir.measure.gpu_lock.reap`)."""
    events = os.fdopen(events_fd, "w", buffering=1)

    def emit(**event: Any) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    server = _Server(options, emit)
    emit(event="ready", name=server.name, pid=os.getpid(), phases=server.start_phases)
    partial: dict[str, Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") != "problem":
            break
        try:
            server.problem(cmd)
        except _Restart:
            partial = {"phases": server.phases}  # the steps of the problem it stopped in, up to the candidate
            break
    emit(event="exit", **partial)
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.read()


# ----------------------------------------------------------------------------------------------------------
# The parent: a supervisor a device


_TIMEOUT, _EOF = "timeout", "eof"


class _Child:
    """One server process, seen from the parent: commands to its stdin, events from a pipe."""

    def __init__(self, options: dict[str, Any], env: dict[str, str], log_dir: Path, serial: int) -> None:
        read, write = os.pipe()
        self.stderr_path = log_dir / f"server{serial}.stderr.txt"
        cmd = [sys.executable, "-m", "convbw_mlir.measure.server", "--serve", str(write), json.dumps(options)]
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=err, stderr=err, env=env,
                                         pass_fds=(write,), text=True)  # fmt: skip
        os.close(write)
        self.fd, self.buf = read, b""

    def send(self, cmd: dict[str, Any]) -> bool:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            return True
        except OSError:  # it died: its events say so
            return False

    def event(self, timeout_s: float) -> dict[str, Any] | str:
        """The next event, or :data:`_TIMEOUT` (none for ``timeout_s``) or :data:`_EOF` (it is gone)."""
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            if not ready:
                return _TIMEOUT
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return _EOF
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def death(self, rc: int | None, timeout_s: float) -> str:
        return death(rc, self.stderr_path.read_text(errors="replace"), timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class _Supervisor:
    """The server of one device: started on demand, restarted after a candidate that failed or killed it."""

    def __init__(self, slot: Any, options: dict[str, Any], timeout_s: float, log: Callable[[str], None],
                 log_dir: Path) -> None:  # fmt: skip
        self.slot, self.options, self.timeout_s, self.log, self.log_dir = slot, options, timeout_s, log, log_dir
        self.env = {**os.environ, **slot.env}
        self.lock = gpu_lock.for_device(options["driver"], options["device"] or 0, self.env)
        self.child: _Child | None = None
        self.pids: list[int] = []
        self.device_name: str | None = None
        self.started: list[dict[str, float]] = []  # each start of the current problem: wall seconds, the server's

    def _start(self) -> str | None:
        """Start a server; None when it is ready, else why not."""
        t0 = time.perf_counter()
        self.child = _Child(self.options, self.env, self.log_dir, len(self.pids))
        ev = self.child.event(max(self.timeout_s, START_TIMEOUT_S))
        if isinstance(ev, dict) and ev.get("event") == "ready":
            self.pids.append(ev["pid"])
            self.device_name = ev["name"]
            self.started.append({"wall_s": time.perf_counter() - t0, **ev.get("phases", {})})
            return None
        why = self._lost(ev)
        return f"the measuring server did not start: {why}"

    def _lost(self, ev: dict[str, Any] | str) -> str:
        """Why the current child stopped answering (it is gone afterwards)."""
        child, self.child = self.child, None
        assert child is not None
        if ev == _TIMEOUT:
            child.kill()
            return child.death(None, self.timeout_s)
        rc = child.proc.wait()
        child.close()
        return child.death(rc, self.timeout_s)

    def _reap(self) -> None:
        child, self.child = self.child, None
        if child is not None:
            gpu_lock.reap(child.proc, self.lock)
            child.close()

    def measure(self, folder: Path, entry: ManifestEntry, state: Path,
                run_options: dict[str, Any] | None = None) -> ResultRow:  # fmt: skip
        """The row of one problem (reference, contenders, cuDNN where asked), as ``measure.run``'s children's;
        ``run_options``: the run's ``use_torch`` and ``numpy_max_flops`` where they differ from the server's start."""
        run_options = run_options or self.options
        names = checks.candidates(entry, run_options)
        results: dict[str, dict[str, Any]] = {}
        t0 = time.perf_counter()
        self.started, served = [], []  # server starts, and the server's phases of each round
        while todo := [n for n in names if n not in results]:
            if self.child is None and (why := self._start()):
                self.log(f"  {entry.key}: {why}")
                results |= {n: {"status": "crashed", "error": why} for n in todo}
                break
            assert self.child is not None
            self.child.send({"cmd": "problem", "folder": str(folder), "entry": entry.to_dict(), "names": todo,
                             "state": str(state), "numpy_max_flops": run_options["numpy_max_flops"]})  # fmt: skip
            pending: str | None = None
            while True:
                ev = self.child.event(self.timeout_s)
                if not isinstance(ev, dict):
                    break
                if ev["event"] == "start":
                    pending = ev["name"]
                elif ev["event"] == "result":
                    results[ev["name"]], pending = ev["result"], None
                    res = ev["result"]
                    if res.get("status") in ("crashed", "failed"):
                        self.log(f"  {entry.key}: {ev['name']}: {res['status']}: {res.get('error')}")
                elif ev["event"] in ("done", "exit"):
                    if "phases" in ev:
                        served.append(ev["phases"])
                    break
            if isinstance(ev, dict):
                if ev["event"] == "exit":  # it stopped after a candidate that raised: the next server goes on
                    self._reap()
                else:  # done: a name it did not answer for would be sent again for ever
                    results |= {n: {"status": "crashed", "error": "never ran"} for n in todo if n not in results}
                continue
            why = self._lost(ev)
            self.log(f"  {entry.key}: {pending or 'the server'}: {why}")
            if pending is None:  # died outside any candidate (inputs, references): none would fare better
                results |= {n: {"status": "crashed", "error": why} for n in todo if n not in results}
                break
            results[pending] = {"status": "crashed", "error": why}
        row = checks.checked_row(entry, names, results)
        return replace(row, extra=row.extra | {"phases": _phases(time.perf_counter() - t0, self.started, served)})

    def close(self) -> None:
        if self.child is not None and self.child.send({"cmd": "quit"}):
            ev = self.child.event(self.timeout_s)
            if isinstance(ev, dict) and ev.get("event") == "exit":
                self._reap()
                return
        if self.child is not None:
            self.child.kill()
            self.child = None


class ServerPool:
    """One server a device, kept across several :class:`Served` runs (a tuning run's passes and phases): each
    start costs seconds (torch, CUPTI: docs/timing.md#tuning-rate), so a run that needs several sets of problems
    measured pays it once. A server is still restarted after a candidate that failed or killed it.

    Args:
        slots: :class:`convbw_mlir.measure.pool.Device` each, one server each.
        options: the servers' start options (as :class:`Served`'s); ``use_torch`` must be on if any run wants cuDNN.
        timeout_s: how long a server may send nothing (a hung candidate reads crashed).
        timing: the timing protocol of every run (:class:`ServerTiming`).

    Raises:
        ValueError: no slot.
    """

    def __init__(self, slots: Sequence[Any], options: dict[str, Any], timeout_s: float,
                 log: Callable[[str], None] = print, timing: ServerTiming | None = None) -> None:  # fmt: skip
        if not slots:
            raise ValueError("slots: expected at least one device")
        self.slots, self.timing = list(slots), timing or ServerTiming()
        self.options = options | {"timing": asdict(self.timing)}
        self._logs = tempfile.TemporaryDirectory(prefix="convbw-servers-")  # the servers' stderr, read on a death
        self.supervisors = [_Supervisor(s, self.options, timeout_s, log, Path(self._logs.name)) for s in self.slots]

    def close(self) -> None:
        """Stop every server (idempotent)."""
        for sup in self.supervisors:
            sup.close()
        self._logs.cleanup()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _phases(measure_s: float, started: list[dict[str, float]], served: list[dict[str, Any]]) -> dict[str, Any]:
    """A problem's ``phases`` record: the parent's ``measure_s`` (command to row), the servers started for it
    (``server_start_s``: process start and imports; ``server_imports_s``, ``server_torch_s``, ``server_cupti_s`` of
    it), the server's steps summed over its rounds (a restart makes several), and ``bookkeeping_s``: the rest
    (pipes, JSON, the parent's work)."""
    out: dict[str, Any] = {"measure_s": measure_s, "rounds": len(served)}
    if started:
        out["server_start_s"] = sum(s["wall_s"] for s in started)
        for key in sorted({k for s in started for k in s} - {"wall_s"}):
            out[f"server_{key}"] = sum(s.get(key, 0.0) for s in started)
    for part in served:
        for key, value in part.items():
            if isinstance(value, dict):
                out.setdefault(key, {}).update(value)
            else:
                out[key] = out.get(key, 0.0) + value
    steps = sum(v for k, v in out.items() if isinstance(v, float) and k.endswith("_s") and k not in _NOT_STEPS)
    out["bookkeeping_s"] = measure_s - steps
    return out


# ``phases`` keys that are parts of another (``timing_wall_s`` of ``timing_s``; the server's start split, and the
# candidates' load, copies, call and check of ``candidates_s``) or the whole: not summed into the steps
_NOT_STEPS = frozenset({"measure_s", "timing_wall_s", "server_imports_s", "server_torch_s", "server_cupti_s", "load_s",
                        "copies_s", "checked_call_s", "check_s"})  # fmt: skip


class Served:
    """``measure.run``'s rows of ``entries`` by one server a device of ``slots`` (``measure.run --server``).

    Iterate for ``(i, (row, device name))`` as each problem is done (``row``: its
    :class:`convbw_mlir.measure.records.ResultRow`, ``device_index`` set); :meth:`summary` then says how it was
    measured.

    Args:
        folder: the manifest's folder (the kernels' paths are relative to it).
        entries: manifest entries (:class:`convbw_mlir.measure.records.ManifestEntry`).
        options: ``driver``, ``device`` (None where ``slots`` pin the device), ``use_torch``,
            ``numpy_max_flops``, ``check_only``.
        slots: :class:`convbw_mlir.measure.pool.Device` each, one server each.
        timeout_s: how long a server may send nothing (a hung candidate reads crashed).
        prep_workers: CPU workers making inputs and float64 references (:data:`PREP_WORKERS`).
        timing: the timing protocol (:class:`ServerTiming`).
        skip: ``skip(i)``, asked as entry ``i`` comes up, leaves it out (a deadline): it yields nothing.
        pool: :class:`ServerPool` whose servers measure this run and stay up after it (its slots and timing are
            the run's; ``slots`` and ``timing`` must then be its own or None). Without one, the run makes a private
            pool whose servers stop as it ends: one code path either way.

    Raises:
        ValueError: ``prep_workers`` below 1, or no slot; a ``pool`` whose servers lack torch for a cuDNN run, or
            whose slots or timing are not the run's.
    """

    def __init__(self, folder: Path, entries: Sequence[ManifestEntry], options: dict[str, Any], slots: Sequence[Any],
                 timeout_s: float, log: Callable[[str], None] = print, prep_workers: int = PREP_WORKERS,
                 timing: ServerTiming | None = None, skip: Callable[[int], bool] | None = None,
                 pool: ServerPool | None = None) -> None:  # fmt: skip
        if not (isinstance(prep_workers, int) and prep_workers >= 1):
            raise ValueError(f"prep_workers: expected a count >= 1, got {prep_workers!r}")
        if not slots:
            raise ValueError("slots: expected at least one device")
        if pool is not None:
            if list(slots) != pool.slots or timing not in (None, pool.timing):
                raise ValueError("pool: its servers' slots and timing must be the run's")
            if options["use_torch"] and not pool.options["use_torch"]:
                raise ValueError("pool: a run with cuDNN (use_torch) needs servers started with torch")
        self.folder, self.entries, self.slots, self.log = folder, list(entries), list(slots), log
        self.timeout_s, self.prep_workers = timeout_s, prep_workers
        self.timing = pool.timing if pool is not None else timing or ServerTiming()
        self.options = options | {"timing": asdict(self.timing)}
        self.pool = pool
        self.supervisors: list[_Supervisor] = []
        self._starts_before = 0  # the pool's servers started before this run
        self.wall_s = 0.0
        self.skip = skip
        self.measured = 0  # problems yielded so far (a deadline's ``skip`` leaves some out)
        self._t0: float | None = None

    def summary(self) -> dict[str, Any]:
        """The protocol and the servers: ``timing``, ``servers`` started by this run (a pool's running servers are
        not counted again), ``problems`` measured, ``wall_s`` and ``problems_per_minute`` (wall clock); asked
        while the run goes on, the figures so far and ``ended`` false (a run killed then leaves those)."""
        starts = sum(len(s.pids) for s in self.supervisors) - self._starts_before
        ended = self._t0 is not None and self.wall_s > 0
        wall = self.wall_s if ended or self._t0 is None else time.monotonic() - self._t0
        rate = 60.0 * self.measured / wall if wall else None
        return {"path": "server", "timing": asdict(self.timing), "servers": starts, "devices": len(self.slots),
                "prep_workers": self.prep_workers, "problems": self.measured, "wall_s": wall,
                "problems_per_minute": rate, "ended": ended}  # fmt: skip

    def __iter__(self) -> Iterator[tuple[int, tuple[ResultRow, str | None]]]:
        self._t0 = time.monotonic()
        pool = self.pool or ServerPool(self.slots, self.options, self.timeout_s, self.log, self.timing)
        # closing: a consumer that stops early ends the workers' queue before the problems' folder goes
        with (
            tempfile.TemporaryDirectory(prefix="convbw-serve-") as tmp,
            contextlib.closing(self._run(Path(tmp), pool)) as items,
        ):
            for item in items:
                self.measured += 1
                yield item
        if self.pool is None:
            pool.close()
        self.wall_s = max(time.monotonic() - self._t0, 1e-9)

    def _run(self, tmp: Path, servers: ServerPool) -> Iterator[tuple[int, tuple[ResultRow, str | None]]]:
        ctx = multiprocessing.get_context("spawn")  # nothing forked from a parent that may hold threads
        todo = collections.deque(range(len(self.entries)))
        futures: dict[int, concurrent.futures.Future] = {}
        guard = threading.Lock()
        done: queue.Queue = queue.Queue()
        window = self.prep_workers + LOOKAHEAD * len(self.slots)

        def state(i: int) -> Path:
            return tmp / f"p{i}"

        def submit(pool: concurrent.futures.Executor, i: int) -> None:
            state(i).mkdir()
            flops = self.options["numpy_max_flops"]
            futures[i] = pool.submit(prepare, self.entries[i].problem, str(state(i)), flops)

        def feed(pool: concurrent.futures.Executor) -> None:  # under guard: keep ``window`` problems prepared ahead
            waiting = set(todo)
            ahead = sum(i in waiting for i in futures)  # prepared or preparing, not yet taken
            for i in todo:
                if ahead >= window:
                    break
                if i not in futures:
                    submit(pool, i)
                    ahead += 1

        def work(sup: _Supervisor, pool: concurrent.futures.Executor) -> None:
            try:
                while True:
                    with guard:
                        if not todo:
                            return
                        i = todo.popleft()
                    if self.skip is not None and self.skip(i):
                        # no inputs made for a skipped problem: past a deadline every later one is, and the run's
                        # end would wait for all their preparations (docs/timing.md#tuning-rate)
                        with guard:
                            if (ahead := futures.pop(i, None)) is not None:
                                ahead.cancel()  # one being made already ends; the run's folder goes with the run
                        continue
                    with guard:
                        if i not in futures:
                            submit(pool, i)
                        feed(pool)
                        future = futures[i]
                    entry = self.entries[i]
                    try:
                        t0 = time.perf_counter()
                        future.result()
                        waited = time.perf_counter() - t0  # the CPU workers behind the GPU: inputs, references
                        row = sup.measure(self.folder, entry, state(i), self.options)
                        row = replace(row, extra=row.extra | {"phases": {"prep_wait_s": waited,
                                                                         **row.extra["phases"]}})  # fmt: skip
                    except Exception as e:  # noqa: BLE001 - the problem's inputs or references could not be made
                        why = f"inputs and references: {type(e).__name__}: {e}".splitlines()[0][:300]
                        self.log(f"  {entry.key}: {why}")
                        names = checks.candidates(entry, self.options)
                        row = checks.checked_row(entry, names, {n: {"status": "crashed", "error": why} for n in names})
                    shutil.rmtree(state(i), ignore_errors=True)
                    with guard:
                        futures.pop(i, None)
                    done.put((i, (replace(row, device_index=sup.slot.index), sup.device_name)))
            finally:
                if self.pool is None:  # a private pool's server stops with its last problem; a caller's stays up
                    sup.close()
                done.put(None)

        quiet = _quiet_worker if self.timing.quiet_host else None
        with concurrent.futures.ProcessPoolExecutor(self.prep_workers, mp_context=ctx, initializer=quiet) as pool:
            with guard:
                feed(pool)
            self.supervisors = servers.supervisors
            self._starts_before = sum(len(s.pids) for s in self.supervisors)
            threads = [threading.Thread(target=work, args=(s, pool), daemon=True) for s in self.supervisors]
            for t in threads:
                t.start()
            running = len(threads)
            try:
                while running:
                    item = done.get()
                    if item is None:
                        running -= 1
                    else:
                        yield item
            finally:
                with guard:  # a consumer that stops early (a signal): no server takes another problem
                    todo.clear()
                    for ahead in futures.values():  # nor is one prepared: the pool's end would wait for them
                        ahead.cancel()
            for t in threads:
                t.join()


def main(argv: list[str] | None = None) -> int:
    """``python -m convbw_mlir.measure.server --serve FD OPTIONS``: a server (started by :class:`Served`)."""
    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.measure.server", description=main.__doc__)
    ap.add_argument("--serve", type=int, required=True, metavar="FD", help="the pipe to write events to")
    ap.add_argument("options", help="JSON: driver, device, use_torch, numpy_max_flops, check_only, timing")
    args = ap.parse_args(argv)
    code = 0
    try:
        _serve(json.loads(args.options), args.serve)
    except Exception:  # noqa: BLE001 - the parent reads why from our stderr and the exit status
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown: after a device fault, releasing the device can hang or abort


if __name__ == "__main__":
    sys.exit(main())
