"""GPU time of a call, from CUPTI through torch.profiler: what a call costs the GPU, without the host.

Since the torch entry point launches our kernels itself (docs/torch.md), the host's share of a call is
the same few microseconds whatever the kernel; the IREE Python runtime's ~70 µs a call hid every kernel
difference below it (docs/decisions.md#kernel-time). Works for any kernel in the process: IREE's CUDA
HAL and cuDNN alike (CUPTI's activity records are per process, not per context).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Back-to-back calls in one profiler session: sustained GPU time a call, as a training step issues them.
CALLS = 50
# GPU activities that are the call's work; the read-back ending the session (a device-to-host copy) is not.
_WORK = ("kernel", "gpu_memset")


def available() -> bool:
    """Whether torch with CUDA is importable here (then CUPTI is)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def warm_up() -> None:
    """CUPTI's first session in a process costs seconds: pay it before anything is timed."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()


def gpu_activities(trace: Path) -> list[tuple[float, float, str, str]]:
    """(start µs, duration µs, category, name) of the GPU activities in a torch.profiler chrome trace."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    return sorted((ev["ts"], ev["dur"], ev["cat"], ev.get("name", "")) for ev in events
                  if ev.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in ev)  # fmt: skip


def kernel_events(trace: Path) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of the kernels alone in a torch.profiler chrome trace."""
    return [(ts, dur, name) for ts, dur, cat, name in gpu_activities(trace) if cat == "kernel"]


def kernel_seconds(call: Callable[[], Any], sync: Callable[[Any], None], calls: int = CALLS) -> dict[str, Any]:
    """GPU time a call over ``calls`` back-to-back calls: the sum of its kernels' and memsets' durations.

    Returns ``kernel_s`` (seconds a call), ``kernels_per_call`` and ``kernel_names`` (the first few).
    ``sync(result)`` waits for the device (e.g. IREE's ``to_host``, torch's synchronize).
    """
    import torch

    sync(call())
    with tempfile.TemporaryDirectory(prefix="convbw-cupti-") as tmp:
        trace = Path(tmp) / "trace.json"
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]  # as bench/explicit_*.py
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(calls):
                out = call()
            sync(out)
        prof.export_chrome_trace(str(trace))
        acts = gpu_activities(trace)
    work = [a for a in acts if a[2] in _WORK]
    if not work:
        raise RuntimeError("CUPTI recorded no GPU kernel for the calls (profiler not tracing this process?)")
    return work_fields(work, calls)


def work_fields(work: list[tuple[float, float, str, str]], calls: int) -> dict[str, Any]:
    """What ``calls`` calls' GPU activities (:func:`gpu_activities`' tuples, the call's work only) say, the one
    reckoning of both timing paths (``measure.run``'s children, ``measure.server``; docs/timing.md#servergap):

    - ``kernel_s``: the activities' durations summed, a call (what the tuner ranks by);
    - ``kernels_per_call``, ``kernel_names`` (the first few);
    - ``kernel_us_each``: each kernel's (or memset's) durations summed by name, µs a call (a split plan's main
      kernel and its stage 2 apart; the first 8 names);
    - ``kernel_busy_s``: the time the device had any of them running, a call (below ``kernel_s`` only where
      activities overlapped: the sum then counts the overlap twice);
    - ``kernel_launch_us``: the longest-running kernel's launches, min, median and max µs (a spread that a few slow
      launches make, or a uniform shift that clocks make), and ``kernel_first_us``, its first launch.
    """
    busy, end = 0.0, -math.inf
    for ts, dur, _, _ in sorted(work):
        busy += max(0.0, ts + dur - max(ts, end))
        end = max(end, ts + dur)
    totals: dict[str, float] = {}
    for _, dur, _, name in work:
        totals[name] = totals.get(name, 0.0) + dur
    main = max(totals, key=lambda n: totals[n])
    launches = sorted((ts, dur) for ts, dur, _, name in work if name == main)
    durs = sorted(dur for _, dur in launches)
    return {
        "kernel_s": sum(a[1] for a in work) * 1e-6 / calls,
        "kernels_per_call": len(work) / calls,
        "kernel_names": sorted({a[3] for a in work})[:4],
        "kernel_us_each": {n: round(totals[n] / calls, 3) for n in sorted(totals)[:8]},
        "kernel_busy_s": busy * 1e-6 / calls,
        "kernel_launch_us": [round(durs[0], 2), round(statistics.median(durs), 2), round(durs[-1], 2)],
        "kernel_first_us": round(launches[0][1], 2),
    }


def kernel_seconds_each(calls: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]], n: int = CALLS,
                        before: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """:func:`kernel_seconds` of several calls in one profiler session (a session costs tens of ms: one a batch).

    ``calls``: name -> (call, sync); each name's ``n`` calls end with its ``sync`` inside a
    ``record_function(name)`` range, and a GPU activity belongs to the range it starts in (each range ends
    with the device idle, so none spills into the next). ``before(name)`` is called as each name starts (the
    caller's progress: a fault at a sync is then that name's). Returns name -> :func:`kernel_seconds`'s fields,
    or ``{"kernel_time_error": why}`` for a name whose range holds no GPU work.
    """
    import torch

    with tempfile.TemporaryDirectory(prefix="convbw-cupti-") as tmp:
        trace = Path(tmp) / "trace.json"
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for name, (call, sync) in calls.items():
                if before is not None:
                    before(name)
                with torch.profiler.record_function(_LABEL + name):
                    for _ in range(n):
                        out = call()
                    sync(out)
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
        ours = (ev for ev in events if ev.get("cat") == "user_annotation" and str(ev.get("name")).startswith(_LABEL))
        ranges = sorted((ev["ts"], ev["name"][len(_LABEL) :]) for ev in ours)
        work: dict[str, list[tuple[float, float, str, str]]] = {name: [] for name in calls}
        for act in gpu_activities(trace):
            owner = next((name for ts, name in reversed(ranges) if ts <= act[0]), None)
            if owner in work and act[2] in _WORK:
                work[owner].append(act)
    out: dict[str, dict[str, Any]] = {}
    for name, acts_ in work.items():
        if not acts_:
            out[name] = {"kernel_time_error": "CUPTI recorded no GPU kernel in this call's range"}
            continue
        out[name] = work_fields(acts_, n)
    return out


# The prefix of kernel_seconds_each's ranges, so that no torch-internal annotation is taken for one.
_LABEL = "convbw-time:"
