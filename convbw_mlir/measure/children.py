"""Child processes that run GPU work, the one harness of the runner (:mod:`convbw_mlir.measure.run`) and the
benchmark scripts (``bench/harness.py``): a kernel that faults the GPU poisons its process's CUDA context,
so each unit of work runs in a child of its own, and this module is what both sides share.

- The parent: :func:`run_batches` runs batches of a script's work in children (``jobs`` at once, a budget, a
  time limit a child, one JSON row a line on their stdout, files not pipes); :func:`death` says why a child
  ended without a result; :func:`announced_exit` and :mod:`convbw_mlir.measure.gpu_lock`'s ``reap`` let a
  child's exit (which frees device memory) happen under the GPU's shared turn, never beside a timing.
- The child: :func:`exit_child` leaves by ``os._exit`` once its output is out and its parent holds that turn
  (IREE's runtime objects die badly with the interpreter; after a device fault, teardown can hang).
- Faults: :data:`FAULT` recognizes an error that names a device fault; :func:`status_of`, :func:`first_line`.

Standard library only at import: the benchmark scripts import it on the GPU machine, without IREE's compiler.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "EXIT_LINE",
    "FAULT",
    "KEEP",
    "ChildRun",
    "announced_exit",
    "death",
    "device_lock",
    "exit_child",
    "first_line",
    "json_rows",
    "problem_row",
    "run_batches",
    "run_child",
    "status_of",
    "write_rows",
]

# Device faults: after one the process's context is unusable. IREE reports CUDA errors as ABORTED; on the H100
# (2026-11-23) a faulting kernel surfaced as "ABORTED; CUDA error 'CUDA_ERROR_ILLEGAL_ADDRESS'" at the result's
# fence, or as a bare "ABORTED; ... hal.device.queue.dealloca" where the dealloca met the failed queue first.
FAULT = re.compile(r"CUDA_ERROR_\w+|cudaError\w+|hipError\w+|illegal (memory )?(address|access)|\bABORTED\b")

# What a child writes last where its parent reaps it under the GPU's shared turn (convbw_mlir.measure.gpu_lock).
EXIT_LINE = json.dumps({"event": "exit"})

# IREE's runtime objects die badly with the interpreter (a segfault when they are freed after torch's): a
# child keeps them here and leaves by os._exit (exit_child) once its output is out.
KEEP: list[Any] = []


def status_of(error: BaseException | str) -> str:
    """``crashed`` for an error that names a device fault, else ``failed``."""
    return "crashed" if FAULT.search(str(error)) else "failed"


def first_line(e: BaseException) -> str:
    """The line of an error that names a device fault, else its first line (IREE's messages run long)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
    return next((ln for ln in lines if FAULT.search(ln)), lines[0])[:300]


def death(rc: int | None, stderr: str, timeout_s: float) -> str:
    """Why a child ended without a result: its signal or exit status, and the last line it wrote."""
    if rc is None:
        how = f"no progress for {timeout_s:g} s (killed)"
    elif rc < 0:
        try:
            how = f"process killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"process killed by signal {-rc}"
    else:
        how = f"process exited with status {rc}"
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fault = next((ln for ln in reversed(lines) if FAULT.search(ln)), lines[-1] if lines else "")
    return f"{how}: {fault[:240]}" if fault else how


def announced_exit(path: Path) -> bool:
    """Whether the child writing ``path`` wrote :data:`EXIT_LINE` last (it waits for its reaping)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - len(EXIT_LINE) - 2))
            return f.read().decode(errors="replace").rstrip().endswith(EXIT_LINE)
    except OSError:
        return False


def exit_child(announce: Callable[[], None] | None = None, code: int = 0) -> NoReturn:
    """A child's end: its output flushed, then ``os._exit(code)`` (IREE's objects in KEEP are never freed), once
    the parent holds the GPU's shared turn: the exit frees device memory. ``announce`` tells the parent the
    child waits (default: :data:`EXIT_LINE` on stdout, what :func:`run_batches` reads)."""
    from convbw_mlir.measure import gpu_lock

    sys.stdout.flush()
    sys.stderr.flush()
    gpu_lock.exit_turn(announce or (lambda: print(EXIT_LINE, flush=True)))
    os._exit(code)


def device_lock() -> Any:
    """The machine-wide lock of the GPU the scripts run on (torch's and IREE's device 0 of the visible ones):
    ``.timing()`` around a timed region (and cuDNN's algorithm search), ``.shared()`` around other GPU work
    (convbw_mlir.measure.gpu_lock). A CPU rehearsal takes it too (a file, no device)."""
    from convbw_mlir.measure import gpu_lock

    return gpu_lock.for_device("cuda", 0)


def write_rows(out: Path, rows: list[dict]) -> None:
    """``OUT/rows.json``: the rows so far, rewritten after each child (what a cut-off run still returns)."""
    (out / "rows.json").write_text(json.dumps(rows, indent=1))


def json_rows(text: str) -> dict[str, dict]:
    """The rows a child printed (JSON objects with a ``name``, one a line), by name; other lines skipped."""
    got = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "name" in rec:
            got[rec["name"]] = rec
    return got


def problem_row(name: str) -> dict[str, Any]:
    """The identity of a ``kind:problem`` contender whose child gave no row."""
    return {"name": name, "kind": name.split(":")[0], "problem": name.split(":", 1)[1]}


@dataclass(frozen=True)
class ChildRun:
    """How one child of :func:`run_child` ended: the last line of its stdout that opens a JSON object (None:
    none), its exit status (None: stopped at the time limit), and its stderr."""

    row: dict[str, Any] | None
    returncode: int | None
    stderr: str
    limit_s: float

    @property
    def ended(self) -> int | str:
        """How it ended: its exit status, or ``timed out after N s``."""
        return self.returncode if self.returncode is not None else f"timed out after {self.limit_s:g} s"


def run_child(cmd: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> ChildRun:
    """Run ``cmd`` (a script's child: one unit of GPU work that prints its row last) to its end or for
    ``timeout_s`` s, whichever comes first; its output captured. A kernel that faults or hangs costs this child,
    not the caller.

    Raises:
        json.JSONDecodeError: the last line that opens a JSON object is not one (a child's bug, not its GPU's).
    """
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        return ChildRun(None, None, err, timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return ChildRun(json.loads(lines[-1]) if lines else None, proc.returncode, proc.stderr, timeout_s)


def run_batches(script: str, folder: Path, out: Path, batches: Iterable[list[str]], budget: float = float("inf"),
                jobs: int = 1, start: float | None = None, child_limit: float | None = None,
                lost: Callable[[str], dict] = problem_row, seconds: str | None = None) -> list[dict]:  # fmt: skip
    """Run each batch of contender names (manifest entries of ``folder``) in a child of its own
    (``script run-one FOLDER NAMES...``: a CUDA fault poisons a process), in order, ``jobs`` at once; past
    ``budget`` s (from ``start``) none starts and running ones are stopped; a child running past
    ``child_limit`` s is stopped (a hung kernel would hold the GPU for the rest). A child that ends by
    :func:`exit_child` is reaped under the GPU's shared turn (:func:`device_lock`). The children's output
    goes to ``OUT/logs``. Returns a row per name: the child's, or ``lost(name)`` marked crashed or skipped;
    ``seconds``: a key under which each row gets its child's wall time. ``OUT/rows.json`` is rewritten
    after each child."""
    from convbw_mlir.measure import gpu_lock

    start = time.time() if start is None else start
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    running: list[tuple[subprocess.Popen, list[str], float]] = []
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    def harvest(proc: subprocess.Popen, names: list[str], t0: float, why: str | None) -> None:
        proc.wait()
        if proc.stdin:
            proc.stdin.close()
        stem = logs / names[0].replace(":", "_")
        stdout, stderr = (stem.with_suffix(s).read_text(errors="replace") for s in (".out", ".err"))
        got = json_rows(stdout)
        for name in names:
            rec = got.get(name)
            if rec is None:
                rec = lost(name)
                rec["crashed" if why is None else "skipped"] = why or f"rc {proc.returncode}: {stderr[-1500:]}"
            if seconds:
                rec[seconds] = round(time.time() - t0, 1)
            rows.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "kernels"}), flush=True)
        print(f"[{time.time() - start:.0f} s] {len(names)} done in {time.time() - t0:.1f} s", flush=True)
        write_rows(out, rows)

    pending = list(batches)
    while pending or running:
        late = time.time() - start > budget
        for item in list(running):
            proc, names, t0 = item
            if proc.poll() is None and announced_exit((logs / names[0].replace(":", "_")).with_suffix(".out")):
                gpu_lock.reap(proc, device_lock())
            hung = child_limit is not None and time.time() - t0 > child_limit
            if proc.poll() is not None or late or hung:
                if proc.poll() is None:
                    proc.kill()  # our own child, by its pid: the budget is spent or it is hung
                    print(f"killed {names} after {time.time() - t0:.0f} s", flush=True)
                harvest(proc, names, t0, None if proc.returncode == 0 or not late else "the budget ran out")
                running.remove(item)
        if late:
            for names in pending:
                for name in names:
                    rows.append(lost(name) | {"skipped": f"not started: the {budget:.0f} s budget ran out"})
            pending = []
            break
        while pending and len(running) < jobs:
            names = pending.pop(0)
            cmd = [sys.executable, script, "run-one", str(folder), *names]
            stem = logs / names[0].replace(":", "_")  # files, not pipes: a chatty child never blocks on them
            env = {**os.environ, gpu_lock.EXIT_TURN_ENV: "1"}  # exit_child waits for us
            with open(stem.with_suffix(".out"), "w") as o, open(stem.with_suffix(".err"), "w") as e:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=o, stderr=e, text=True, env=env)
            running.append((proc, names, time.time()))
        time.sleep(0.2)
    return rows
