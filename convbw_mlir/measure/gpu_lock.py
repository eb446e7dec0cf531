"""One lock a GPU, machine-wide: nothing else runs on a device while a kernel on it is timed.

Several measuring processes on one GPU (``measure.run --jobs N``, the bench scripts' ``--jobs``, two runs
started side by side) share it by time slices: a kernel timed while another process copies, allocates,
searches cuDNN's algorithms or runs a float64 reference reads up to 2.5 times its time (issue 39: 1,034 us
against 404 us for one kernel). So every process that touches a GPU takes that device's lock, a file under
:func:`lock_dir` named after the device's identity (its UUID where ``nvidia-smi`` gives it, so that every
process names one GPU alike, whatever it sees as device 0):

- :meth:`DeviceLock.timing`, **exclusive**, around a timed region (and cuDNN's algorithm search, itself a
  timing): no other process holds the device in any way meanwhile;
- :meth:`DeviceLock.shared`, **shared**, around any other GPU work (context creation, copies, allocation and
  freeing, references and checks on the GPU, a child's exit): such work of several workers overlaps, none of
  it overlaps a timed region, and the CPU work between (set-up, compiling, numpy's float64) holds nothing.

A region must have finished its GPU work when it leaves (a read-back or a synchronize ends it): the lock
orders what runs on the device, not what was queued. Waiting timers go first: a turnstile file keeps new
shared holders out while a timer waits for the current ones to leave. Work of a process that takes no lock
(another user's job) is not kept out: measure on a GPU no one else uses.

A child's exit frees its device memory outside any code of its own: :func:`exit_turn` (the child) and
:func:`reap` (its parent, which holds the shared turn meanwhile) make the exit a shared region too.
Standard library only: the GPU machine's run side imports it without the IREE compiler.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["DeviceLock", "EXIT_TURN_ENV", "LOCK_DIR_ENV", "device_key", "exit_turn", "for_device", "lock_dir", "reap"]

# Where the lock files live: one folder for every process of the machine (a run's own temp dir would not be seen
# by a second run on the same GPU, the failure of the per-run locks this replaces).
LOCK_DIR_ENV = "CONVBW_GPU_LOCK_DIR"
# Set by a parent that reaps its children under the shared turn (:func:`reap`): the child then waits for it.
EXIT_TURN_ENV = "CONVBW_GPU_EXIT_TURN"
# The variable that hides every other GPU from a process, per IREE driver (as measure.pool pins workers).
VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES"}


def lock_dir() -> Path:
    """``$CONVBW_GPU_LOCK_DIR``, else ``<temp dir>/convbw-gpu-locks`` (made, writable by every user).

    Raises:
        ValueError: the folder cannot be made (naming it and the variable that chooses it).
    """
    folder = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "convbw-gpu-locks")
    if not folder.is_dir():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # another user's runs take the same GPU's lock
                folder.chmod(0o1777)
        except OSError as e:
            raise ValueError(f"{LOCK_DIR_ENV}: cannot make the GPU lock folder {str(folder)!r}: {e}") from None
    return folder


@functools.cache
def _smi_uuids() -> dict[str, str]:
    """nvidia-smi's index -> UUID (its numbering is the PCI bus order), asked without opening a device."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    pairs = (line.split(",") for line in out.splitlines() if line.count(",") == 1)
    return {i.strip(): u.strip() for i, u in pairs}


def device_key(driver: str, index: int = 0, environ: Mapping[str, str] | None = None) -> str:
    """The identity of the ``index``-th device ``driver`` shows a process with ``environ`` (default ours).

    The physical device is ``*_VISIBLE_DEVICES``'s ``index``-th entry (else ``index``), named by its UUID where
    the entry is one or nvidia-smi maps its index to one (nvidia-smi counts in PCI bus order, the order
    ``measure.pool`` pins in: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); else ``<driver><index>``. ``local-task`` (the
    host, the CPU stand-in) is one device.
    """
    env = os.environ if environ is None else environ
    if driver not in VISIBLE:
        return driver
    value = env.get(VISIBLE[driver])
    ids = None if value is None else [v.strip() for v in value.split(",") if v.strip() and v.strip() != "-1"]
    physical = ids[index] if ids is not None and index < len(ids) else str(index)
    if re.match(r"(GPU|MIG)-", physical):
        return physical
    uuid = _smi_uuids().get(physical) if driver == "cuda" else None
    return uuid or f"{driver}{physical}"


class DeviceLock:
    """The lock of one device (:func:`for_device`): :meth:`timing` exclusive, :meth:`shared` for other GPU work.

    Re-entrant within a process: ``shared`` inside either is a no-op; ``timing`` inside ``shared`` leaves the
    shared turn, waits for the device alone, and takes the shared turn again after.

    Args:
        key: the device's identity (:func:`device_key`); the lock file is ``<folder>/<key>.lock``.
        folder: where the lock files are (default :func:`lock_dir`).
    """

    def __init__(self, key: str, folder: Path | None = None) -> None:
        if not key:
            raise ValueError("key: expected a device's identity, got ''")
        self.key = key
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        self.folder = lock_dir() if folder is None else Path(folder)
        self.path = self.folder / f"{stem}.lock"
        self._turnstile_path = self.folder / f"{stem}.turnstile"
        self._file: int | None = None
        self._pid = os.getpid()  # a forked child shares our open file, hence our lock: it opens its own
        self.mode: str | None = None  # None, "shared" or "timing": what this process holds now

    def _open(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        with contextlib.suppress(OSError):  # another user's process opens it too
            os.fchmod(fd, 0o666)
        return fd

    def _take(self, exclusive: bool) -> None:
        if self._pid != os.getpid():
            self._file, self._pid, self.mode = None, os.getpid(), None
        if self._file is None:
            self._file = self._open(self.path)
        gate = self._open(self._turnstile_path)
        try:
            # through the turnstile: a timer holds it while it waits, so no new shared turn starts meanwhile
            fcntl.flock(gate, fcntl.LOCK_EX)
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(self._file, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            os.close(gate)  # releases the turnstile

    def _leave(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the device beside other shared holders, never beside a timer."""
        if self.mode is not None:
            yield
            return
        self._take(exclusive=False)
        self.mode = "shared"
        try:
            yield
        finally:
            self.mode = None
            self._leave()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Hold the device alone: every other holder, shared or timing, of every process waits."""
        before = self.mode
        if before == "timing":
            yield
            return
        if before == "shared":
            self._leave()
        self._take(exclusive=True)
        self.mode = "timing"
        try:
            yield
        finally:
            if before == "shared":  # back to the turn the caller held (through the turnstile: timers first)
                self._leave()
                self._take(exclusive=False)
            else:
                self._leave()
            self.mode = before


def for_device(driver: str, index: int = 0, environ: Mapping[str, str] | None = None) -> DeviceLock:
    """This process's lock of the ``index``-th device ``driver`` shows a process with ``environ`` (default
    ours; :func:`device_key`): one object a device and lock folder (two would exclude each other within the
    process), so that nested regions know what it holds."""
    return _lock_of(device_key(driver, index, environ), str(lock_dir()))


@functools.cache
def _lock_of(key: str, folder: str) -> DeviceLock:
    return DeviceLock(key, Path(folder))


def exit_turn(announce: Any) -> None:
    """A child's last step, where its parent reaps it under the shared turn (``$CONVBW_GPU_EXIT_TURN``):
    ``announce()`` tells the parent, then wait until the parent holds the turn and closes our stdin."""
    if os.environ.get(EXIT_TURN_ENV) != "1":
        return
    announce()
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.buffer.read()  # end of file: the parent holds the turn (or died)


def reap(proc: subprocess.Popen, lock: DeviceLock, timeout_s: float = 120.0) -> int:
    """Let a child that announced its exit (:func:`exit_turn`) go, and wait for it under the shared turn:
    the freeing of its device memory overlaps no timed region. A child still there after ``timeout_s`` is
    killed. Returns its exit status."""
    stdin: IO[bytes] | None = proc.stdin  # type: ignore[assignment]
    with lock.shared():
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
