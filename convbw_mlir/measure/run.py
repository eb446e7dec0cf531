"""Run side of the benchmark: needs only iree-base-runtime, numpy and (if importable) torch.

    python -m convbw_mlir.measure.run DIR [--filter SUBSTR] [--out results.json] [--devices 0,1,..] [--driver D]
                                        [--no-torch] [--timeout SECONDS] [--jobs N] [--server]

For each problem of ``DIR/manifest.json`` a child process (so that a kernel that faults the GPU, which
poisons the process's CUDA context, costs only its own result) makes random x and dy (seeded),
device-resident; runs the GPU reference and checks it against float64 on a random sample of dW entries
(and against the whole numpy float64 reference where that takes seconds); then runs every contender and
cuDNN through torch (``torch.backends.cudnn.benchmark = True``, channels-last, the same layout and type).
Each result is checked against float64 on the sample and against the whole reference (numpy's, or the GPU
reference where it passed its check), with tolerances derived from the reduction length and the types
(docs/tolerances.md); errors are reported in units of the RMS of dW and in ulps of dW's type. A wrong
result is reported as WRONG and not timed as a win. Each contender is timed the same way (warm-up, then
batches of calls each ended by reading the result back, at least 20 batches and 0.2 s, median and spread).
A contender whose child dies, hangs, or raises a device fault is recorded as ``crashed`` with its message;
the problem's other contenders then run in a fresh child. With several GPUs (``--devices``, default every
visible one) one worker per GPU takes the next problem (:mod:`convbw_mlir.measure.pool`); ``--jobs N`` puts N
workers on each GPU, whose CPU work overlaps. Every GPU step takes the device's machine-wide lock
(:mod:`convbw_mlir.measure.gpu_lock`): a timing (and cuDNN's algorithm search) holds the device alone; other GPU
work (context creation, copies, references, checks, a child's exit) shares it, never beside a timing; the CPU
work between holds nothing. Writes JSON, a markdown table and a PNG plot next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from convbw_mlir.measure import gpu_lock
from convbw_mlir.measure.checks import (
    NUMPY_REFERENCE_MAX_FLOPS,
    DirectKernel,
    Torch,
    _lock,
    _Problem,
    _run_reference,
    _stats,
    _torch,
    candidates,
    checked_row,
    error_stats,
    load_checked,
    sample_indices,
    tolerance_rms,
)
from convbw_mlir.measure.children import announced_exit, death, exit_child, first_line, status_of
from convbw_mlir.measure.records import ManifestEntry, ResultRow
from convbw_mlir.runtime import time_calls

__all__ = [
    "DirectKernel",
    "error_stats",
    "main",
    "manifest_entries",
    "read_manifest",
    "run_manifest",
    "sample_indices",
    "tolerance_rms",
]

# A child silent this long (a kernel that never ends) is killed; the contender it was running reads crashed.
STEP_TIMEOUT_S = 600
# Exit status of a child that stopped after a failed contender, so the problem's next one gets a fresh process.
_RESTART = 3


def _run_contender(folder: Path, prob: _Problem, rec: dict, driver: str, device: int | None,
                   timed: bool = True) -> dict[str, Any]:  # fmt: skip
    res, loaded = load_checked(folder, prob, rec, driver, device)
    if loaded is not None and timed:
        kernel, xd, dyd = loaded
        with _lock(driver, device).timing():
            res |= _stats(time_calls(kernel, xd, dyd))
            res |= _gpu_time(lambda: kernel(xd, dyd), lambda r: r.to_host(), driver)
    return res


def _run_cudnn(prob: _Problem, torch_: Torch | None) -> dict[str, Any]:
    if torch_ is None:
        return {"status": "n/a", "error": "no CUDA torch"}
    why = torch_.supports(prob.p)
    if why:
        return {"status": "n/a", "error": why}
    lock = _lock("cuda", None)  # torch's device 0: the one this child is pinned to, or the driver's first
    with lock.shared():
        call, to_ours = torch_.prepare(prob.p, prob.x, prob.dy)
        with lock.timing():  # the first call searches cuDNN's algorithms by timing them: it holds the device alone
            dw = call()
            torch_.sync()
        got = to_ours(dw)
    res = prob.check(got, prob.p.dw_dtype)
    if res["status"] == "ok":
        with lock.timing():
            res |= _stats(time_calls(call, sync=torch_.sync))
            res |= _gpu_time(call, lambda _: torch_.sync(), "cuda")
    return res


_CUPTI: list[bool] = []  # whether this child can time by CUPTI, decided (and CUPTI warmed up) once


def _gpu_time(call: Any, sync: Any, driver: str) -> dict[str, Any]:
    """``kernel_s``: the call's GPU time by CUPTI (:mod:`convbw_mlir.measure.cupti`), on CUDA where torch
    is importable; the tuner ranks by it (docs/decisions.md#kernel-time). Its failure is recorded, not fatal."""
    from convbw_mlir.measure import cupti

    if driver != "cuda":
        return {}
    try:
        if not _CUPTI:
            _CUPTI.append(cupti.available())
            if _CUPTI[0]:
                cupti.warm_up()
        return cupti.kernel_seconds(call, sync) if _CUPTI[0] else {}
    except Exception as e:  # noqa: BLE001 - the call's own timing stands; only the kernel time is missing
        return {"kernel_time_error": first_line(e)}


def _child(spec: dict) -> int:
    """Run the contenders ``spec["names"]`` of one problem, writing one JSON event a line to ``spec["events"]``.

    Returns 0 when all ran, :data:`_RESTART` after one that raised (its error recorded): whatever it did
    to the device, the problem's next contender gets a fresh process.
    """
    folder, state = Path(spec["folder"]), Path(spec["state"])
    entry, driver, device = ManifestEntry.from_dict(spec["entry"]), spec["driver"], spec["device"]
    events = open(spec["events"], "a", buffering=1)  # noqa: SIM115 - line-buffered, each event lands at once

    def emit(**event: Any) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()
        os.fsync(events.fileno())

    with _lock(driver, device).shared():  # torch's CUDA context: allocation on the device
        torch_ = _torch() if spec["use_torch"] and driver == "cuda" else None
    emit(event="device", name=torch_.name if torch_ else driver)
    prob = _Problem(entry.conv(), state, spec["numpy_max_flops"])
    contenders = entry.contenders
    for name in spec["names"]:
        emit(event="start", name=name)
        try:  # each takes the device's lock for its GPU steps (shared) and its timing (alone)
            if name == "reference":
                res = _run_reference(folder, prob, contenders.get("reference", {}), driver, device)
            elif name == "cudnn":
                res = _run_cudnn(prob, torch_)
            else:
                res = _run_contender(folder, prob, contenders[name], driver, device, not spec.get("check_only"))
            if name == "reference":
                prob.save()
        except Exception as e:  # noqa: BLE001 - recorded; the next contender runs in a fresh process
            emit(event="result", name=name, result={"status": status_of(e), "error": first_line(e)})
            return _RESTART
        emit(event="result", name=name, result=res)
    emit(event="done")
    return 0


# ----------------------------------------------------------------------------------------------------------
# The parent: one child per problem, a fresh one after a contender that failed or killed its process


def _append_event(path: str, event: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def _wait(child: subprocess.Popen, events: Path, timeout_s: float, lock: gpu_lock.DeviceLock) -> int | None:
    """The child's exit status, or None where it wrote no event for ``timeout_s`` (then it is killed). A child
    that announces its exit (``exit`` event) is let go and reaped under ``lock``'s shared turn."""
    last_size, deadline = -1, time.monotonic() + timeout_s
    while (rc := child.poll()) is None:
        size = events.stat().st_size if events.exists() else 0
        if size != last_size:  # each contender's start and result is an event: progress
            last_size, deadline = size, time.monotonic() + timeout_s
            if size and announced_exit(events):
                return gpu_lock.reap(child, lock)
        elif time.monotonic() > deadline:
            child.kill()
            child.wait()
            return None
        time.sleep(0.05)
    return rc


def _run_problem(folder: Path, entry: ManifestEntry, options: dict, timeout_s: float, log,
                 env: dict[str, str] | None = None) -> tuple[ResultRow, str | None]:  # fmt: skip
    """One problem's row (:func:`checked_row`) and the device name.

    ``options``: driver, device, use_torch, numpy_max_flops, as the children take them; ``env``: what
    the children's environment adds (the device they are pinned to, :mod:`convbw_mlir.measure.pool`).
    """
    child_env = {**os.environ, **(env or {}), gpu_lock.EXIT_TURN_ENV: "1"}
    lock = gpu_lock.for_device(options["driver"], options["device"] or 0, child_env)
    names = candidates(entry, options)
    results: dict[str, dict] = {}
    device_name = None
    with tempfile.TemporaryDirectory(prefix="convbw-run-") as tmp:
        for attempt in range(len(names) + 1):
            todo = [n for n in names if n not in results]
            if not todo:
                break
            ev_path, err_path = Path(tmp) / f"events{attempt}.jsonl", Path(tmp) / f"stderr{attempt}.txt"
            spec = {
                "folder": str(folder),
                "entry": entry.to_dict(),
                "names": todo,
                "state": tmp,
                "events": str(ev_path),
            }
            spec |= options
            (Path(tmp) / "spec.json").write_text(json.dumps(spec))
            cmd = [sys.executable, "-m", "convbw_mlir.measure.run", "--child", str(Path(tmp) / "spec.json")]
            with open(err_path, "w") as err:
                child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=err, stderr=err, env=child_env)
                rc = _wait(child, ev_path, timeout_s, lock)
            pending, done = None, False
            for line in ev_path.read_text().splitlines() if ev_path.exists() else []:
                ev = json.loads(line)
                if ev["event"] == "device":
                    device_name = ev["name"]
                elif ev["event"] == "start":
                    pending = ev["name"]
                elif ev["event"] == "result":
                    results[ev["name"]], pending = ev["result"], None
                    if ev["result"].get("status") in ("crashed", "failed"):
                        log(f"  {entry.key}: {ev['name']}: {ev['result']['status']}: {ev['result'].get('error')}")
                elif ev["event"] == "done":
                    done = True
            if done:
                break
            if rc == _RESTART:
                continue
            why = death(rc, err_path.read_text(errors="replace"), timeout_s)
            log(f"  {entry.key}: {pending or 'the child'}: {why}")
            if pending is None:  # died outside any contender (inputs, sample): nothing else will fare better
                for n in todo:
                    results[n] = {"status": "crashed", "error": why}
                break
            results[pending] = {"status": "crashed", "error": why}
    return checked_row(entry, names, results), device_name


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """``folder/manifest.json``, its header checked (``target``, ``iree_version``, ``problems``).

    Raises:
        ValueError: no such file, not JSON, or a missing or mistyped field, naming the file.
    """
    from convbw_mlir.jsonio import read_json, require_fields

    path = Path(folder) / "manifest.json"
    manifest = read_json(path, "manifest")
    return require_fields(manifest, {"target": str, "iree_version": str, "problems": list}, f"manifest {path}")


def manifest_entries(manifest: dict[str, Any], folder: str | Path) -> list[ManifestEntry]:
    """The problems of a manifest (:func:`read_manifest`) as records.

    Raises:
        ValueError: an entry that is not an object or lacks a field, naming the manifest and the entry.
    """
    where = f"manifest {Path(folder) / 'manifest.json'}"
    return [ManifestEntry.from_dict(e, f"{where}: problems[{i}]") for i, e in enumerate(manifest["problems"])]


def run_manifest(folder: str | Path, filt: str = "", device: int | None = None, driver: str | None = None,
                 use_torch: bool = True, log=print, timeout_s: float = STEP_TIMEOUT_S,
                 numpy_max_flops: float = NUMPY_REFERENCE_MAX_FLOPS, check_only: bool = False,
                 devices: Sequence[int] | str | None = None, env: dict[str, str] | None = None,
                 jobs: int = 1, server: bool = False, server_timing: Any = None) -> dict:  # fmt: skip
    """Run every problem of a manifest, each in child processes; returns the results (see the module docstring).

    ``check_only`` checks every contender (NaN fences, float64) and times none (the fenced fuzz).

    ``timeout_s`` bounds each step of a child (the reference, a contender: a hung kernel reads crashed);
    ``numpy_max_flops`` bounds the problems checked against the whole numpy float64 reference (every one
    is checked on a float64 sample).

    ``devices``: indexes among the visible GPUs (``"all"``: every one), one measuring worker pinned to
    each, problems dealt to whichever is free (:mod:`convbw_mlir.measure.pool`); rows come back in the
    manifest's order, each naming its ``device_index`` where there are several. None: every problem on
    ``device`` (the driver's index, default its first), here; ``env``, where given, pins the children
    instead (what :class:`convbw_mlir.measure.pool.Device` holds: they see only their device).

    ``jobs``: measuring workers a device, problems dealt to whichever is free: their process start, inputs and
    float64 references (seconds of CPU a problem) overlap; every GPU step takes the device's machine-wide lock
    (:mod:`convbw_mlir.measure.gpu_lock`), a timing alone, so timings are as with one.

    ``server``: one persistent measuring process a device instead of a child a problem, each candidate checked
    once and the correct ones timed in one batch, inputs and float64 references made ahead by CPU workers
    (:mod:`convbw_mlir.measure.server`); the results then name its protocol (``server``). ``server_timing``: that
    protocol (a :class:`convbw_mlir.measure.server.ServerTiming`; None: its defaults).

    Raises:
        ValueError: a device that is not visible, or none visible for a GPU driver, or ``jobs`` below 1, or
            ``jobs`` above 1 with ``server`` (before any child starts).
    """
    from convbw_mlir.measure.pool import Device, deal, resolve_devices

    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs: expected a count >= 1, got {jobs!r}")
    if server and jobs != 1:
        raise ValueError(f"jobs: the server is one process a device, got jobs={jobs} (its CPU work has workers)")

    folder = Path(folder).resolve()
    manifest = read_manifest(folder)
    driver = driver or _target(manifest["target"]).driver
    if devices is None:
        slots = [Device(driver, device or 0, env or {})]
    else:
        slots = resolve_devices(driver, None if devices == "all" else devices)
    results: dict[str, Any] = {
        "device": driver,
        "driver": driver,
        "target": manifest["target"],
        "iree_version": manifest["iree_version"],
        "date": time.strftime("%Y-%m-%d"),
        "problems": [],
    }
    slots = [d for d in slots for _ in range(jobs)]  # several workers a device: its lock orders their GPU steps
    pinned = devices is not None or bool(env)  # the children see only their device: the driver's first
    options = {"driver": driver, "device": None if pinned else device, "use_torch": use_torch,
               "numpy_max_flops": numpy_max_flops, "check_only": check_only}  # fmt: skip
    todo = [(str(folder), e, options, timeout_s) for e in manifest_entries(manifest, folder) if filt in e.key]
    several = len({d.index for d in slots}) > 1  # one device: the rows as before the pool, naming none
    rows: dict[int, ResultRow] = {}
    if server:
        from convbw_mlir.measure.server import Served

        measured: Any = Served(folder, [t[1] for t in todo], options, slots, timeout_s, log, timing=server_timing)
        source: Any = measured
    else:
        source = deal(_measure_entry, todo, slots, log, lost=_lost_entry)
    for i, (row, device_name) in source:
        if device_name and results["device"] == driver:
            results["device"] = device_name
        rows[i] = replace(row, several_devices=several)
        log(_line(rows[i]))
    if server:
        results["server"] = measured.summary()
    from convbw_mlir.targets import RUNS_SM80

    roof = next((t for key, t in RUNS_SM80.items() if key in results["device"]), None)
    for i, row in rows.items():
        if roof:
            p = todo[i][1].conv()
            rows[i] = replace(row, roofline_s=roof.roofline_seconds(p.flops, p.min_bytes, p.dtype))
    results["problems"] = [rows[i].to_dict() for i in sorted(rows)]
    return results


def _target(name: str) -> Any:
    from convbw_mlir.targets import get_target

    return get_target(name)


def _measure_entry(payload: tuple, device: Any, log: Any) -> tuple[ResultRow, str | None]:
    """One manifest entry's row, measured in children pinned to ``device`` (a pool worker's task)."""
    folder, entry, options, timeout_s = payload
    row, device_name = _run_problem(Path(folder), entry, options, timeout_s, log, device.env)
    return replace(row, device_index=device.index), device_name


def _lost_entry(payload: tuple, why: str) -> tuple[ResultRow, None]:
    """The row of an entry whose measuring worker died: every contender crashed, with why."""
    entry: ManifestEntry = payload[1]
    crashed = {n: {"status": "crashed", "error": why} for n in entry.contenders if n != "reference"}
    return ResultRow.head(entry, crashed, {"reference_error": why}), None


def _line(row: ResultRow) -> str:
    parts = [f"{row.key:<42}"]
    for name, r in row.contenders.items():
        if r.get("status") == "ok" and "median_s" in r:
            parts.append(f"{name} {r['median_s'] * 1e6:9.1f}us")
        else:
            parts.append(f"{name} {r.get('status')}")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # a child of _run_problem
        spec = json.loads(Path(argv[1]).read_text())
        code = _child(spec)
        # the exit frees our device memory: the parent reaps us under the device's shared turn (_wait); no
        # teardown: after a device fault, releasing the device can hang or abort
        exit_child(lambda: _append_event(spec["events"], {"event": "exit"}), code)
    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.measure.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--filter", default="")
    ap.add_argument("--out", default=None, help="results JSON (default FOLDER/results.json)")
    ap.add_argument(
        "--devices",
        default=None,
        help="GPUs to measure on, one worker each: indexes like 0,1 (default: every visible GPU)",
    )
    ap.add_argument("--device", type=int, default=None, help="one device by the driver's index, not pinned")
    ap.add_argument("--driver", default=None, help="override the manifest target's driver")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--timeout", type=float, default=STEP_TIMEOUT_S, help="seconds one contender may run")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="measuring workers a device: set-up and float64 references overlap, GPU steps never do",
    )
    ap.add_argument(
        "--server",
        action="store_true",
        help="one persistent measuring process a device, candidates checked once and timed in batches (tuning)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1 or (args.server and args.jobs != 1):
        why = "with --server: one process a device" if args.jobs >= 1 else "expected a count >= 1"
        print(f"error: --jobs: {why}, got {args.jobs}", file=sys.stderr)
        return 1
    if not args.timeout > 0:
        print(f"error: --timeout: expected seconds > 0, got {args.timeout}", file=sys.stderr)
        return 1
    from convbw_mlir.measure.pool import parse_devices, resolve_devices
    from convbw_mlir.measure.report import write_report

    t0 = time.time()
    try:
        manifest = read_manifest(args.folder)  # a missing or malformed manifest: one line, before any child starts
        manifest_entries(manifest, args.folder)
        if args.device is not None and args.devices is not None:
            raise ValueError("--device and --devices: give one")
        devices = None if args.device is not None else parse_devices(args.devices) if args.devices else "all"
        if devices is not None:  # no GPU, or one that is not there: one line, before any child starts
            resolve_devices(args.driver or _target(manifest["target"]).driver, None if devices == "all" else devices)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    results = run_manifest(
        args.folder,
        args.filter,
        args.device,
        args.driver,
        not args.no_torch,
        timeout_s=args.timeout,
        devices=devices,
        jobs=args.jobs,
        server=args.server,
    )
    out = Path(args.out or Path(args.folder) / "results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, out)
    print(f"wrote {out} and its .md/.png ({len(results['problems'])} problems, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
