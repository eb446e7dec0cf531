"""One measuring process per GPU: problems dealt from one queue to a worker pinned to each device.

The parent never opens a device. It counts the GPUs from ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES``)
or ``nvidia-smi`` (``rocm-smi``), starts one worker per device with the ``spawn`` method (a fresh
interpreter: nothing is forked after CUDA is initialised), pins each through the environment its
measuring children inherit, and deals the next problem to whichever worker is free. A worker still runs
every problem in child processes (:mod:`convbw_mlir.measure.run`): a kernel that crashes or hangs costs
its own result; a worker that dies costs the problem it held (``lost``) and a fresh worker takes its device.
With one device nothing is spawned: the problems run here, one after the other, as before the pool.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from convbw_mlir.measure.gpu_lock import VISIBLE

__all__ = ["DEVICES_HELP", "Device", "deal", "parse_devices", "resolve_devices", "visible_gpus"]

# The variable that hides every other GPU from a process and its children, per IREE driver.
_VISIBLE = VISIBLE
_SMI = {"cuda": ["nvidia-smi", "-L"], "hip": ["rocm-smi", "--showuniqueid"]}
_SMI_LINE = {"cuda": re.compile(r"^GPU \d+:"), "hip": re.compile(r"^GPU\[(\d+)\]")}

DEVICES_HELP = ("GPUs to time on, one measuring process each, problems dealt to whichever is free: indexes "
                "among the visible GPUs like 0,1 (default: every visible GPU; on the host, one worker)")  # fmt: skip


@dataclass(frozen=True)
class Device:
    """One measuring slot: ``index`` among the driver's visible devices, and what pins a process to it."""

    driver: str
    index: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.driver}:{self.index}"


def parse_devices(text: str) -> list[int]:
    """``"0,1,3"`` -> ``[0, 1, 3]``.

    Raises:
        ValueError: an entry that is not an index >= 0, or one given twice (naming ``--devices`` and it).
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--devices: expected device indexes like 0,1, got {text!r} ({part!r} is not one)")
        if int(part) in out:
            raise ValueError(f"--devices: device {part} is given twice in {text!r}")
        out.append(int(part))
    return out


def _visible_list(driver: str) -> list[str] | None:
    """The physical ids the environment leaves visible to ``driver``, or None where it says nothing."""
    value = os.environ.get(_VISIBLE.get(driver, ""))
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip() and v.strip() != "-1"]


def visible_gpus(driver: str) -> int:
    """How many GPUs of ``driver`` a process here sees, asked without opening any (no CUDA/HIP context).

    ``*_VISIBLE_DEVICES`` where set, else the vendor's SMI tool; 0 where neither finds one.
    """
    ids = _visible_list(driver)
    if ids is not None:
        return len(ids)
    cmd = _SMI.get(driver)
    if cmd is None or shutil.which(cmd[0]) is None:
        return 0
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len({m.group(0) for line in out.splitlines() if (m := _SMI_LINE[driver].match(line.strip()))})


def _pin(driver: str, index: int) -> dict[str, str]:
    """The environment that leaves a process only the ``index``-th visible device of ``driver``."""
    if driver not in _VISIBLE:
        return {}  # local-task: the "devices" are stand-ins, each a worker on the same CPU
    ids = _visible_list(driver)
    physical = ids[index] if ids is not None else str(index)
    env = {_VISIBLE[driver]: physical}
    if driver == "cuda":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # nvidia-smi's numbering, the one --devices counts in
    return env


def resolve_devices(driver: str, devices: Sequence[int] | None) -> list[Device]:
    """The devices to measure on: ``devices`` (indexes among the visible ones), default every visible GPU.

    For ``local-task`` (the host) the indexes are stand-ins, one worker each (default one).

    Raises:
        ValueError: no GPU visible for a GPU driver, or an index beyond the visible ones (naming it).
    """
    if driver.startswith("local"):
        return [Device(driver, i) for i in (devices or [0])]
    count = visible_gpus(driver)
    if count == 0:
        var = _VISIBLE.get(driver, "")
        seen = f"{var}={os.environ[var]!r}" if var in os.environ else f"{_SMI.get(driver, ['its SMI tool'])[0]}"
        raise ValueError(f"--devices: no {driver} GPU is visible here (asked {seen}); time on a machine with one")
    devices = list(range(count)) if devices is None else list(devices)
    if not devices:
        raise ValueError("--devices: empty")
    for d in devices:
        if not 0 <= d < count:
            raise ValueError(f"--devices: device {d} does not exist: {count} {driver} GPU(s) visible (0-{count - 1})")
    return [Device(driver, d, _pin(driver, d)) for d in devices]


# ----------------------------------------------------------------------------------------------------------
# The pool

Work = Callable[[Any, Device, Callable[[str], None]], Any]


def _worker(fn: Work, device: Device, conn: Any) -> None:
    """A worker's loop: pinned to ``device`` for good, then one payload at a time until ``None``."""
    os.environ.update(device.env)

    def log(line: str) -> None:
        conn.send(("log", line))

    while (task := conn.recv()) is not None:
        i, payload = task
        try:
            conn.send(("done", i, fn(payload, device, log)))
        except Exception as e:  # noqa: BLE001 - reported as the payload's loss; the worker goes on
            conn.send(("error", i, f"{type(e).__name__}: {e}".splitlines()[0][:300]))


def deal(fn: Work, payloads: Sequence[Any], devices: Sequence[Device], log: Callable[[str], None] = print,
         lost: Callable[[Any, str], Any] | None = None,
         skip: Callable[[Any], bool] | None = None) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """``(i, fn(payloads[i], device, log))`` as each finishes, over one worker per device.

    ``fn`` must be a module-level function (a spawned worker imports it). ``skip(payload)``, asked just
    before a payload is dealt, leaves it out (a deadline). A worker that dies or a payload whose ``fn``
    raises yields ``(i, lost(payload, why))`` (``lost`` default: raise ``RuntimeError``); a dead worker's
    device gets a fresh one.
    """
    lost = lost or _raise
    todo = deque(enumerate(payloads))
    if len(devices) <= 1:  # one device: here, in order, as before the pool
        while todo:
            i, p = todo.popleft()
            if not (skip and skip(p)):
                yield i, fn(p, devices[0], log)
        return
    ctx = multiprocessing.get_context("spawn")
    # one pipe per worker, not a shared queue: a worker killed mid-message cannot block the others
    # keyed by the slot's place in ``devices``: one device may hold several slots (run_manifest's jobs)
    workers: dict[int, tuple[Any, Any]] = {}
    busy: dict[int, tuple[int, Any]] = {}
    by_index = dict(enumerate(devices))

    def start(slot: int) -> None:
        dev = devices[slot]
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(fn, dev, theirs), name=f"convbw-measure-{dev.label}-{slot}")
        proc.daemon = True  # a parent that dies takes its workers with it
        proc.start()
        theirs.close()
        workers[slot] = (proc, mine)

    def give(d: int) -> None:
        while todo:
            i, p = todo.popleft()
            if skip and skip(p):
                continue
            busy[d] = (i, p)
            workers[d][1].send((i, p))
            return

    try:
        for slot in range(len(devices)):
            start(slot)
            give(slot)
        while busy:
            conns = {workers[d][1]: d for d in busy}
            for conn in multiprocessing.connection.wait(list(conns), timeout=1.0):
                d = conns[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # the worker died: its pipe closed (with nothing left unread)
                    workers[d][0].join(timeout=10)
                    i, p = busy.pop(d)
                    why = f"the measuring worker of {by_index[d].label} died (exit status {workers[d][0].exitcode})"
                    log(why)
                    yield i, lost(p, why)
                    conn.close()
                    start(d)
                    give(d)
                    continue
                if msg[0] == "log":
                    log(f"[{by_index[d].label}] {msg[1]}")
                    continue
                i = busy.pop(d)[0]
                yield i, (msg[2] if msg[0] == "done" else lost(payloads[i], msg[2]))
                give(d)
    finally:
        for proc, conn in workers.values():
            try:
                if proc.is_alive():
                    conn.send(None)
            except OSError:
                pass
        for proc, conn in workers.values():
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()


def _raise(payload: Any, why: str) -> Any:
    raise RuntimeError(why)
