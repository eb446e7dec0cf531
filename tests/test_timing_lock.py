"""Timing that other workers cannot disturb (issue 39): the machine-wide GPU lock of convbw_mlir.measure.gpu_lock.

The GPU here is a CPU stand-in: a device shared by time slices, where a timed kernel that another process's kernel
overlaps for ``t`` seconds reads ``t`` seconds longer (two contexts take turns). A worker busy with long kernels
(float64 references, copies) beside a timer inflates its figure without the lock, and cannot with it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from convbw_mlir.measure import gpu_lock
from convbw_mlir.measure.gpu_lock import DeviceLock

BENCH = Path(__file__).resolve().parents[1] / "bench"

# The stand-in device: every kernel writes its interval (monotonic clock, one for all processes) into the device's
# folder, the start before it runs and the end once it is done; a timer reads what overlapped its own run.
STAND_IN = '''
import json, os, time
from pathlib import Path

class StandInGpu:
    def __init__(self, folder):
        self.folder, self.n = Path(folder), 0

    def _record(self, interval):
        rec = self.folder / f"{os.getpid()}-{self.n}.json"
        tmp = rec.with_suffix(".tmp")
        tmp.write_text(json.dumps(interval))
        tmp.replace(rec)  # whole: a timer reads it meanwhile

    def kernel(self, seconds):
        self.n += 1
        start = time.monotonic()
        self._record([start, None])
        time.sleep(seconds)
        self._record([start, time.monotonic()])

    def timed(self, seconds):
        """The kernel's time as the device gives it: its own ``seconds`` plus every second another
        process's kernel ran beside it (time slices)."""
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        stolen = 0.0
        for rec in self.folder.glob("*.json"):
            start, end = json.loads(rec.read_text())
            stolen += max(0.0, min(t1, end if end is not None else t1) - max(t0, start))
        return seconds + stolen
'''

# A measuring worker's other GPU work, in a loop: long kernels (a float64 reference, copies), each under the
# device's shared turn where it takes the lock, until told to stop.
BUSY = (
    STAND_IN
    + """
import sys
from convbw_mlir.measure.gpu_lock import DeviceLock
gpu, lock, use_lock = StandInGpu(sys.argv[1]), DeviceLock("stand-in", Path(sys.argv[2])), sys.argv[3] == "1"
stop, started = Path(sys.argv[2]) / "stop", Path(sys.argv[2]) / "started"
while not stop.exists():
    if use_lock:
        with lock.shared():
            gpu.kernel(0.6)
    else:
        gpu.kernel(0.6)
    started.touch()
    time.sleep(0.01)
"""
)

KERNEL_S = 0.2


def _timed_beside_a_busy_worker(tmp_path: Path, use_lock: bool) -> list[float]:
    """Three timings of a KERNEL_S kernel while another process runs long kernels on the same stand-in GPU."""
    device, locks = tmp_path / "device", tmp_path / "locks"
    device.mkdir()
    locks.mkdir()
    scope: dict = {}
    exec(STAND_IN, scope)  # noqa: S102 - the stand-in's source, shared with the busy worker's
    gpu, lock = scope["StandInGpu"](device), DeviceLock("stand-in", locks)
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(device), str(locks), "1" if use_lock else "0"])
    try:
        deadline = time.monotonic() + 60
        while not any(device.glob("*.json")):  # its first kernel runs
            assert busy.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        figures = []
        for _ in range(3):
            if use_lock:
                with lock.timing():
                    figures.append(gpu.timed(KERNEL_S))
            else:
                figures.append(gpu.timed(KERNEL_S))
            time.sleep(0.05)  # the busy worker's next kernel starts meanwhile
    finally:
        (locks / "stop").touch()
        busy.wait(60)
    return figures


def test_a_worker_busy_with_long_kernels_inflates_a_timing_beside_it_without_the_lock(tmp_path):
    """The inflation of issue 39 (1,034 us for a 404 us kernel under --jobs 4), reproduced on the stand-in."""
    figures = _timed_beside_a_busy_worker(tmp_path, use_lock=False)
    assert max(figures) > 1.5 * KERNEL_S, figures


def test_with_the_lock_the_timed_figure_does_not_move_beside_a_busy_worker(tmp_path):
    figures = _timed_beside_a_busy_worker(tmp_path, use_lock=True)
    assert figures == [KERNEL_S] * 3  # no second of another kernel beside any timing


_PROBE = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if sys.argv[2] == "shared" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(7)
""")


def _could_take(lock: DeviceLock, how: str) -> bool:
    """Whether another process could take ``lock``'s file ``how`` (shared or exclusive) right now."""
    return subprocess.run([sys.executable, "-c", _PROBE, str(lock.path), how]).returncode == 0


def test_shared_gpu_work_overlaps_other_shared_work_and_never_a_timing(tmp_path):
    lock = DeviceLock("GPU-1234", tmp_path)
    with lock.shared():  # a reference or a copy: another worker's references and copies go on beside it
        assert lock.mode == "shared"
        assert (_could_take(lock, "shared"), _could_take(lock, "exclusive")) == (True, False)
        with lock.timing():  # a timing inside: the device alone, then the shared turn again
            assert lock.mode == "timing"
            assert (_could_take(lock, "shared"), _could_take(lock, "exclusive")) == (False, False)
            with lock.shared():  # GPU work inside a timing keeps the device alone
                assert lock.mode == "timing"
        assert lock.mode == "shared" and _could_take(lock, "shared")
    assert lock.mode is None and _could_take(lock, "exclusive")


def test_a_waiting_timer_keeps_new_shared_turns_out(tmp_path):
    """Workers whose shared turns follow each other without a gap would starve a timer: the turnstile lets it in."""
    lock, timer = DeviceLock("gpu", tmp_path), DeviceLock("gpu", tmp_path)  # two objects: two holders
    order: list[str] = []
    lock._take(exclusive=False)
    waiting = threading.Thread(target=lambda: (timer._take(exclusive=True), order.append("timer"), timer._leave()))
    waiting.start()
    time.sleep(0.3)  # the timer waits for the shared holder, holding the turnstile
    later = DeviceLock("gpu", tmp_path)
    newcomer = threading.Thread(target=lambda: (later._take(exclusive=False), order.append("shared"), later._leave()))
    newcomer.start()
    time.sleep(0.3)
    assert order == []  # neither: the newcomer queues behind the waiting timer
    lock._leave()
    waiting.join(10)
    newcomer.join(10)
    assert order == ["timer", "shared"]


def test_device_key_names_one_gpu_alike_whatever_a_process_sees(monkeypatch):
    monkeypatch.setattr(gpu_lock, "_smi_uuids", lambda: {"0": "GPU-aaa", "3": "GPU-ddd"})
    assert gpu_lock.device_key("cuda", 1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "GPU-ddd"  # pinned to physical 3
    assert gpu_lock.device_key("cuda", 0, {}) == "GPU-aaa"
    assert gpu_lock.device_key("cuda", 0, {"CUDA_VISIBLE_DEVICES": "GPU-fff"}) == "GPU-fff"
    assert gpu_lock.device_key("cuda", 0, {"CUDA_VISIBLE_DEVICES": "5"}) == "cuda5"  # nvidia-smi does not know it
    assert gpu_lock.device_key("hip", 0, {"HIP_VISIBLE_DEVICES": "1"}) == "hip1"
    assert gpu_lock.device_key("local-task", 3, {}) == "local-task"  # the host: one device


def test_an_unusable_lock_folder_is_one_error_naming_the_variable(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(gpu_lock.LOCK_DIR_ENV, str(tmp_path / "file" / "locks"))
    with pytest.raises(ValueError, match=r"^CONVBW_GPU_LOCK_DIR: cannot make the GPU lock folder '.*file/locks'"):
        gpu_lock.lock_dir()


def test_a_child_exits_only_once_its_parent_holds_the_shared_turn(tmp_path, monkeypatch):
    """A child's exit frees its device memory: it waits (exit_turn) until the parent reaps it under the shared
    turn, so while another process times, it stays."""
    monkeypatch.setenv(gpu_lock.EXIT_TURN_ENV, "1")
    code = "from convbw_mlir.measure import gpu_lock; gpu_lock.exit_turn(lambda: print('exiting', flush=True))"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "exiting\n"
    timer = DeviceLock("gpu", tmp_path)
    got: list[int] = []
    with timer.timing():
        reaper = threading.Thread(target=lambda: got.append(gpu_lock.reap(child, DeviceLock("gpu", tmp_path))))
        reaper.start()
        time.sleep(0.5)
        assert child.poll() is None and not got  # the timing goes on: the child has not left
    reaper.join(30)
    assert got == [0]


# -- the harnesses take the lock where they should -----------------------------------------------------------


class _Recorder:
    """What the device lock held (``mode``) at each step of a measurement."""

    def __init__(self, lock: DeviceLock) -> None:
        self.lock, self.steps = lock, []

    def __call__(self, step: str) -> None:
        self.steps.append((step, self.lock.mode))


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    from convbw_mlir.measure import run

    monkeypatch.setenv(gpu_lock.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setattr(gpu_lock, "_smi_uuids", lambda: {})
    return _Recorder(run._lock("cuda", None)), run


class _Problem:
    def __init__(self, record) -> None:
        import numpy as np

        self.record = record
        self.x, self.dy = np.zeros(4, np.float16), np.zeros(4, np.float16)
        self.p = type("P", (), {"dw_dtype": "f16"})()

    def check(self, got, dw_dtype, mma=True):
        self.record("check")
        return {"status": "ok"}


def test_measure_run_checks_a_contender_in_the_shared_turn_and_times_it_alone(tmp_path, monkeypatch, recorder):
    rec, run = recorder

    class Kernel:
        def __init__(self, data, driver, device):
            rec("load")

        def to_device_fenced(self, a):
            rec("copy")
            return a

        def __call__(self, x, dy):
            return self

        def to_host(self):
            rec("read back")
            return x

    x = [0.0]
    from convbw_mlir.measure import checks

    monkeypatch.setattr(checks, "Kernel", Kernel)  # the candidate's loading and check: shared with the server
    monkeypatch.setattr(run, "time_calls", lambda *a, **k: rec("time") or [1e-6] * 3)
    monkeypatch.setattr(run, "_gpu_time", lambda *a: rec("kernel time") or {})
    (tmp_path / "k.vmfb").write_bytes(b"")
    res = run._run_contender(tmp_path, _Problem(rec), {"ok": True, "vmfb": "k.vmfb"}, "cuda", None)
    assert res["status"] == "ok"
    assert rec.steps == [("load", "shared"), ("copy", "shared"), ("copy", "shared"), ("read back", "shared"),
                         ("check", None), ("time", "timing"), ("kernel time", "timing")]  # fmt: skip


def test_measure_run_searches_cudnn_algorithms_and_times_cudnn_alone(monkeypatch, recorder):
    rec, run = recorder

    class Torch:
        def supports(self, p):
            return None

        def prepare(self, p, x, dy):
            rec("copy")
            return (lambda: rec("call")), (lambda dw: rec("read back"))

        def sync(self):
            pass

    monkeypatch.setattr(run, "time_calls", lambda *a, **k: rec("time") or [1e-6] * 3)
    monkeypatch.setattr(run, "_gpu_time", lambda *a: rec("kernel time") or {})
    res = run._run_cudnn(_Problem(rec), Torch())
    assert res["status"] == "ok"
    assert rec.steps == [("copy", "shared"), ("call", "timing"), ("read back", "shared"), ("check", None),
                         ("time", "timing"), ("kernel time", "timing")]  # fmt: skip


def test_bench_profile_calls_holds_the_gpu_alone(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv(gpu_lock.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(gpu_lock, "_smi_uuids", lambda: {})
    import harness

    lock, modes = harness.device_lock(), []

    class Profile:  # torch.profiler.profile's part that profile_calls uses
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def export_chrome_trace(self, path):
            modes.append(("export", lock.mode))
            Path(path).write_text("{}")

    torch = type("T", (), {"profiler": type("P", (), {"profile": Profile})})
    harness.profile_calls(lambda: modes.append(("call", lock.mode)), lambda r: None, torch, [], 1, 1, lambda t: None)
    assert set(modes) == {("call", "timing"), ("export", None)}


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import harness
print(json.dumps({"name": sys.argv[-1], "single_us": 1.0}), flush=True)
harness.exit_child()
"""


def test_bench_children_exit_under_the_shared_turn(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv(gpu_lock.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setattr(gpu_lock, "_smi_uuids", lambda: {})
    import harness

    script = tmp_path / "child.py"
    script.write_text(CHILD.replace("sys.argv[1]", repr(str(BENCH))))
    got: list = []
    runner = threading.Thread(target=lambda: got.append(harness.run_batches(str(script), tmp_path, tmp_path / "out",
                                                                           [["ok:a"]])))  # fmt: skip
    timer = DeviceLock(harness.device_lock().key, tmp_path / "locks")
    with timer.timing():
        runner.start()
        out = tmp_path / "out" / "logs" / "ok_a.out"
        deadline = time.monotonic() + 60
        while not (out.exists() and harness.EXIT_LINE in out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert runner.is_alive() and not got  # the child waits to exit while another process times
    runner.join(60)
    assert [{k: r[k] for k in ("name", "single_us")} for r in got[0]] == [{"name": "ok:a", "single_us": 1.0}]
    assert "crashed" not in got[0][0] and json.loads((tmp_path / "out" / "rows.json").read_text()) == got[0]
