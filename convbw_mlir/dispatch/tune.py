"""Tuning with measurement, in two halves that also work apart.

Compile half (needs the IREE compiler): :func:`compile_candidates` builds every candidate of every
problem (:func:`convbw_mlir.dispatch.variants.candidates`) in parallel child processes through the
kernel cache, plus the GPU reference kernel, into a folder whose ``manifest.json`` the benchmark runner
(:mod:`convbw_mlir.measure.run`) reads.

Timing half (needs only the IREE runtime): :func:`time_candidates` runs the runner's method on each
problem (a child process per problem, every result checked against float64 and the GPU reference,
timed in batches; a wrong or crashing candidate is never selected), then re-times the winner and the
runner-up in a second pass (the noise and how often the order flips), and writes the raw results.

:func:`build_database` turns the results into a :class:`convbw_mlir.dispatch.db.TuningDB`: per problem
(held-out ones excepted) the fastest correct variant, kept only where it beats the heuristic's own plan
by more than the measured noise.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.db import DatabaseError, TuningDB, check_header
from convbw_mlir.dispatch.variants import IREE_FORMS, Variant, known_wrong
from convbw_mlir.measure.pool import DEVICES_HELP, parse_devices, resolve_devices
from convbw_mlir.measure.records import ManifestEntry
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = [
    "build_database",
    "compile_candidates",
    "database_from_results",
    "held_out",
    "reference_task",
    "summarize",
    "time_candidates",
    "TuneRecord",
    "write_candidate",
]

# Every third problem of a suite (positions 2, 5, 8 ... from 0) is held out of tuning, decided before any
# measurement: the untuned path (nearest neighbour or heuristic) is measured on these (docs/dispatch.md).
HELD_OUT_EVERY = 3
# A variant replaces the heuristic's plan only when faster by more than this (or twice the measured noise).
MIN_GAIN = 0.03
# Pass 2 re-times the top two only where they are this close: wider gaps it never corrected (docs/timing.md#pass2)
PASS2_WITHIN = 0.05
# Problems whose float64 reference numpy computes in about a second; larger ones use the GPU reference.
NUMPY_MAX_FLOPS = 2e9
# The runner's name of cuDNN's result: timed beside the candidates (``cudnn=True``), never one of them.
CUDNN = "cudnn"
# A row's field while its pass 2 is due and not run (the names it will re-time): the row's winner is pass 1's alone.
PASS2_PENDING = "pass2_pending"
# With held-out problems, the tuned phase (both passes) ends by this share of ``--deadline``: the held-out ones
# (fewer contenders, no pass 2) get the rest.
TUNED_SHARE = 0.75


def held_out(index: int) -> bool:
    """Whether the suite problem at 0-based ``index`` is held out of tuning."""
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def reference_task(problem: ConvBwdWeightProblem, key: str, target: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The GPU reference of one problem built in a child process (a build task of :func:`compile_candidates`):
    its manifest record and its files (name -> bytes), which the caller writes into the output folder."""
    from convbw_mlir.build.contenders import compile_contenders
    from convbw_mlir.build.isolate import call

    with tempfile.TemporaryDirectory(prefix="convbw-reference-") as tmp:
        try:
            rec = call(compile_contenders, problem, key, target, Path(tmp), ("reference",), what=f"{key} reference")
            rec = json.loads(json.dumps(rec["reference"]))
        except Exception as e:  # noqa: BLE001 - a reference that does not build is recorded; the runner uses float64
            rec = {"ok": False, "error": str(e).splitlines()[0][:300] if str(e) else type(e).__name__}
        return rec, {f.name: f.read_bytes() for f in Path(tmp).iterdir()}


def write_candidate(folder: Path, stem: str, variant: Variant, result: Any, heuristic: bool) -> dict[str, Any]:
    """A built candidate's manifest record, its kernel written into ``folder`` as ``stem``.vmfb (and ``stem``.launch,
    the direct launch's files, where it has tensor maps: IREE's runtime cannot run it); a failed build's error."""
    rec: dict[str, Any] = {"variant": variant.to_dict(), "heuristic": heuristic}
    if not result.ok:
        return rec | {"ok": False, "error": result.error}
    rec |= {"ok": True, "vmfb": f"{stem}.vmfb", "flags": variant.flags}
    (folder / rec["vmfb"]).write_bytes(result.op.vmfb)
    if result.op.driver == "cuda":
        from convbw_mlir.build.cubin import kernel_image

        rec["kernel_image"] = kernel_image(result.op.vmfb)  # ptx (the driver JIT-compiles it at load) or cubin
    if result.op.launch is not None and result.op.launch.tensor_maps:
        rec["launch"] = f"{stem}.launch"
        (folder / rec["launch"]).mkdir()
        for file_name, data in result.op.launch.files().items():
            (folder / rec["launch"] / file_name).write_bytes(data)
    return rec


def compile_candidates(problems: list[tuple[str, ConvBwdWeightProblem, bool]], target: str,
                       out: str | os.PathLike, max_workers: int = 2, max_plans: int = 4,
                       cache: Any = None, progress: bool | None = None,
                       log: Callable[[str], None] = print, engine: str = "local",
                       address: str | None = None, iree: bool = True,
                       iree_forms: tuple[str, ...] = IREE_FORMS, timeout: float | None = None) -> Any:  # fmt: skip
    """Build the candidates of ``problems`` ((name, problem, held out) each) for ``target`` into ``out``.

    Returns the build's :class:`convbw_mlir.dispatch.build.BuildReport`. ``out`` appears whole at the end
    (built beside it); a variant that fails or crashes IREE is recorded in the manifest, not fatal.
    ``engine``: ``local`` (``max_workers`` child processes here) or ``ray`` (a Ray task a compile, on a
    local Ray of ``max_workers`` CPUs or the cluster at ``address``); the folder's content is the same.
    ``iree``: IREE's own forms among the candidates, those of ``iree_forms``
    (:func:`convbw_mlir.dispatch.variants.candidates`).
    ``timeout``: seconds one variant's compile may take (default the build's); one past it is recorded as failed.

    Raises:
        ValueError: an unknown engine, an address without Ray, Ray not installed, ``max_workers`` below 1, no
            Ray cluster answering at ``address`` (before any build, and before Ray starts).
    """

    from convbw_mlir.dispatch.build import Registry
    from convbw_mlir.dispatch.engine import check_engine, run_tasks, session
    from convbw_mlir.files import atomic_directory

    check_engine(engine, address, max_workers)
    reg = Registry(target, cache)
    per_problem = []
    for _name, problem, _ in problems:
        per_problem.append(reg.declare_candidates(problem, max_plans=max_plans, iree=iree, iree_forms=iree_forms))
    keys = [f"{i:03d}-{name}.{p.dtype}" for i, (name, p, _) in enumerate(problems)]
    with session(engine, max_workers, address):  # one Ray session for the variants and the references
        limit = {"timeout": timeout} if timeout is not None else {}
        report = reg.build(max_workers=max_workers, progress=progress, engine=engine, address=address, **limit)
        refs: list[Any] = [None] * len(problems)  # the GPU reference of each problem
        jobs = [(p, key, target) for (_, p, _), key in zip(problems, keys)]
        for i, r in run_tasks(reference_task, jobs, engine, max_workers, address):
            refs[i] = r if isinstance(r, tuple) else ({"ok": False, "error": str(r)}, {})
    by = {(r.problem, r.variant): r for r in report.results}
    entries = []
    with atomic_directory(out) as tmp:
        for (name, problem, held), key, variants, (ref, files) in zip(problems, keys, per_problem, refs):
            for file_name, data in files.items():
                (tmp / file_name).write_bytes(data)
            contenders: dict[str, Any] = {"reference": ref}
            for j, v in enumerate(variants):
                r = by[(problem, v)]
                contenders[v.name] = write_candidate(tmp, f"{key}.v{j}", v, r, heuristic=j == 0)
            entries.append(ManifestEntry(name, key, problem.to_dict(), contenders, {"held_out": held}).to_dict())
        write_manifest(tmp, target, entries, report, engine)
    log(report.table())
    return report


def write_manifest(folder: Path, target: str, entries: list[dict[str, Any]], report: Any,
                   engine: str = "local") -> None:  # fmt: skip
    """``folder``/manifest.json: the candidates' ``entries`` (:class:`ManifestEntry` dicts) and how ``report`` (a
    :class:`convbw_mlir.dispatch.build.BuildReport`) built them, as the runner and the tuner read it."""
    from importlib.metadata import version

    build = {"engine": engine, "workers": report.workers, "wall_s": report.wall_s, "kernels": len(report.results)}
    manifest = {"target": target, "date": str(datetime.date.today()), "iree_version": version("iree-base-compiler"),
                "build": build, "problems": entries}  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _metric(*rows: dict[str, dict]) -> str:
    """The time a problem's contenders are ranked by: ``kernel_s`` (GPU time by CUPTI) where every correct,
    timed contender of ``rows`` has it, else ``median_s`` (the call's time through IREE's runtime, whose
    ~70 µs a call hides kernel differences below it: docs/decisions.md#kernel-time)."""
    ok = [r for c in rows for n, r in c.items() if n != CUDNN and r.get("status") == "ok" and "median_s" in r]
    return "kernel_s" if ok and all("kernel_s" in r for r in ok) else "median_s"


def _ranked(contenders: dict[str, dict], metric: str | None = None) -> list[tuple[float, str]]:
    """(seconds, name) of the correct, timed contenders, fastest first, by ``metric`` (:func:`_metric`); cuDNN is
    timed beside them, never one of them."""
    metric = metric or _metric(contenders)
    return sorted((r[metric], n) for n, r in contenders.items()
                  if n != CUDNN and r.get("status") == "ok" and "median_s" in r)  # fmt: skip


def time_candidates(folder: str | os.PathLike, out: str | os.PathLike, filt: str = "",
                    log: Callable[[str], None] = print, deadline_s: float | None = None,
                    devices: Sequence[int] | None = None, timeout_s: float | None = None,
                    keys: Collection[str] | None = None, server: bool = False,
                    cudnn: bool = False) -> dict[str, Any]:  # fmt: skip
    """Time every candidate of the manifest in ``folder`` (runtime only) in two passes; write ``out``.

    Pass 1: :func:`convbw_mlir.measure.run.run_manifest` per problem (no cuDNN). Pass 2: the winner and the
    runner-up again, in a fresh process, where they are within :data:`PASS2_WITHIN`. Tuned problems
    first, held-out ones after (their choice comes from the tuned ones). ``out`` (JSON) is rewritten whole
    (through a temporary file) as each problem is timed, so a run killed at any point leaves a valid results
    file with every problem timed so far, and every measured candidate is appended to the records beside it
    (:func:`records_path`, one JSON object a line). ``keys``: only these manifest keys.

    ``deadline_s``: the run's budget in seconds. No problem starts that would not end within it, with its pass 2
    and the pass 2 still due of those timed (estimated from this phase's problems timed so far); with held-out
    problems the tuned phase has :data:`TUNED_SHARE` of it. A pass 2 the deadline cuts is not run: the row keeps
    pass 1's figures and says so (:data:`PASS2_PENDING`).

    ``devices``: indexes among the visible GPUs, one measuring worker pinned to each, problems dealt to
    whichever is free (:mod:`convbw_mlir.measure.pool`; default every visible GPU, one worker on the host);
    the results are in the manifest's order whichever device measured them. ``timeout_s``: how long one
    candidate may run before it reads crashed (:data:`convbw_mlir.measure.run.STEP_TIMEOUT_S`).

    ``server``: each phase's pass 1, then its pass 2, through one persistent measuring process a device
    (:mod:`convbw_mlir.measure.server`: candidates checked once, timed in batches, its shorter protocol) instead
    of two children a problem; a problem's row lands after its pass 1 (marked :data:`PASS2_PENDING` where pass 2
    is due) and again after its pass 2; ``out`` names the servers (``server``).

    ``cudnn``: cuDNN (through torch, its algorithm search done once before timing) is checked and timed in pass 1
    in the same process as the candidates, after them, never overlapping (row contender ``cudnn``); the
    database entry then carries its time (``cudnn_s``). It is never a candidate.

    Raises:
        ValueError: no GPU visible for a GPU target, or a device that is not visible (before any timing).
    """
    from importlib.metadata import version

    from convbw_mlir.measure.run import STEP_TIMEOUT_S, manifest_entries, read_manifest
    from convbw_mlir.targets import get_target

    folder = Path(folder).resolve()
    manifest = read_manifest(folder)
    slots = resolve_devices(get_target(manifest["target"]).driver, devices)
    todo = sorted(
        (e for e in manifest_entries(manifest, folder) if filt in e.key and (keys is None or e.key in keys)),
        key=lambda e: e.held_out,
    )
    results: dict[str, Any] = {"target": manifest["target"], "iree_version": manifest["iree_version"],
                               "date": time.strftime("%Y-%m-%d"), "device": None, "problems": []}  # fmt: skip
    records = _Records(records_path(out), {"target": manifest["target"], "iree_version": manifest["iree_version"],
                                           "product_version": version("convbw-mlir")})  # fmt: skip
    with _Run(folder, Path(out), slots, log, timeout_s or STEP_TIMEOUT_S, cudnn, results, records,
              deadline_s=deadline_s, has_held=any(e.held_out for e in todo)) as run:  # fmt: skip
        if server:
            from convbw_mlir.measure.server import ServerPool

            results["server"] = []  # one summary a server run (pass 1, pass 2 of each phase)
            # one server a device for every pass and phase: a start costs seconds (docs/timing.md#tuning-rate)
            run.pool = ServerPool(slots, _server_options(slots, cudnn), run.timeout_s, log)
        _phases_of(run, todo)
    return results


def _server_options(slots: Sequence[Any], cudnn: bool) -> dict[str, Any]:
    """The measuring servers' options of a tuning run (pass 2 asks for no cuDNN and no whole float64 dW)."""
    return {"driver": slots[0].driver, "device": None, "use_torch": cudnn, "numpy_max_flops": NUMPY_MAX_FLOPS,
            "check_only": False}  # fmt: skip


@dataclass
class _Pace:
    """The deadline's estimate within one phase, from pass 1's wall clock over the problems timed so far."""

    start: float
    problems: int = 0
    candidates: int = 0
    pending: int = 0  # candidates pass 2 will re-time

    def add(self, row: dict[str, Any]) -> None:
        self.problems += 1
        self.candidates += len(row["contenders"])
        self.pending += len(row.get(PASS2_PENDING) or ())

    def needed(self, now: float) -> float:
        """Seconds one more problem needs, with its own pass 2 and the pass 2 due of those timed: pass 1's seconds
        a problem and a candidate so far (an over-estimate of pass 2, which checks on the sample only, no cuDNN)."""
        if not self.candidates:
            return 0.0
        wall = now - self.start
        return wall / self.problems + wall / self.candidates * self.pending * (1 + 1 / self.problems)


@dataclass
class _Run:
    """One tuning run's shared state: the manifest's folder, the devices and their servers (``pool``: owned, closed
    on exit), the deadline's clock, and the results file ``out`` every row lands in as it comes (rewritten whole
    through a temporary file, the records beside it appended)."""

    folder: Path
    out: Path
    slots: Sequence[Any]
    log: Callable[[str], None]
    timeout_s: float
    cudnn: bool
    results: dict[str, Any]
    records: _Records
    pool: Any = None
    deadline_s: float | None = None
    has_held: bool = False
    clock: Callable[[], float] = time.monotonic
    rows: dict[int, dict] = field(default_factory=dict)
    _texts: dict[int, str] = field(default_factory=dict)  # each row's JSON: a rewrite re-encodes the new one only
    t0: float = field(init=False)
    pace: _Pace = field(init=False)

    def __post_init__(self) -> None:
        self.t0 = self.clock()
        self.pace = _Pace(self.t0)

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.close()

    def phase(self) -> None:
        """A phase starts: the deadline's estimate starts afresh (held-out problems have fewer contenders)."""
        self.pace = _Pace(self.clock())

    def _budget(self, held: bool) -> float | None:
        if self.deadline_s is None:
            return None
        return self.deadline_s * (1.0 if held or not self.has_held else TUNED_SHARE)

    def late(self, payload: dict) -> bool:
        """Whether pass 1 of ``payload``'s problem would end, with the pass 2 due, past its phase's budget."""
        budget = self._budget(payload["held"])
        now = self.clock()
        if budget is None or now - self.t0 + self.pace.needed(now) <= budget:
            return False
        self.log(f"deadline: {payload['entry'].key} not timed")
        return True

    def late_pass2(self, entry: ManifestEntry) -> bool:
        """Whether the tuned phase's budget is spent: ``entry``'s pass 2 is not run, its pass-1 row stands."""
        budget = self._budget(False)
        if budget is None or self.clock() - self.t0 <= budget:
            return False
        self.log(f"deadline: {entry.key}: pass 2 not run (pass 1's figures stand)")
        return True

    def land(self, i: int, done: dict[str, Any]) -> None:
        """Problem ``i``'s row (``done``: ``row``, ``device``, ``passes`` new in it, default both) into the results,
        the records and ``out``."""
        row, device, passes = done["row"], done["device"], done.get("passes", (1, 2))
        res = self.results
        res["device"] = res["device"] or (device and _device_name(device, self.slots))
        name = res["device"] if device in ("cuda", "hip") else device  # the runner's, or smi's
        if len(self.slots) == 1:
            row.pop("device_index", None)  # one device: the rows as before the pool
        elif name:
            row["device"] = name
        self.rows[i] = row
        self._texts.pop(i, None)
        self.records.append(row, name or res["device"], passes)
        if 1 in passes:
            self.pace.add(row)
        self.write()

    def write(self) -> None:
        """``out`` as the results stand: valid JSON whenever the run is killed."""
        from convbw_mlir.files import write_atomic

        self.results["problems"] = [self.rows[i] for i in sorted(self.rows)]
        for i in self.rows:
            if i not in self._texts:
                self._texts[i] = json.dumps(self.rows[i], indent=1)
        head = json.dumps({k: v for k, v in self.results.items() if k != "problems"}, indent=1)
        rows = ",\n".join(self._texts[i] for i in sorted(self.rows))
        write_atomic(str(self.out), f'{head[:-2]},\n "problems": [\n{rows}\n]\n}}\n')


def _phases_of(run: _Run, todo: list[ManifestEntry]) -> None:
    """:func:`time_candidates`' two phases (tuned, then held out), each problem's row landing as it comes."""
    from convbw_mlir.measure.pool import deal

    for held in (False, True):  # the held-out phase needs every tuned problem's result: one after the other
        phase = [(i, e) for i, e in enumerate(todo) if e.held_out == held]
        payloads = []
        for _, entry in phase:
            if held:  # the untuned path only: the heuristic, IREE's forms, and select's choice from the tuned ones
                entry = _untuned_entry(entry, run.results)
            payloads.append({"folder": str(run.folder), "entry": entry, "held": held, "cudnn": run.cudnn,
                             "timeout_s": run.timeout_s})  # fmt: skip
        run.phase()
        if run.pool is not None:
            source: Any = _served_phase(run, payloads)
        else:
            source = deal(_time_problem, payloads, run.slots, run.log, lost=_lost_problem, skip=run.late)
        for j, done in source:
            run.land(phase[j][0], done)
        if payloads:
            run.write()  # the phase's server summaries


def records_path(out: str | os.PathLike) -> Path:
    """The append-only records beside the results ``out``: ``results.json`` -> ``results.records.jsonl``."""
    out = Path(out)
    return out.with_name(out.stem + ".records.jsonl")


@dataclass(frozen=True)
class TuneRecord:
    """One measured candidate in one pass: a line of the records beside the results (:func:`records_path`).

    ``run`` names the tuning run (its start and process); ``verdict`` is the runner's status (``ok``,
    ``WRONG``, ``crashed`` ...); ``times``: the result's seconds (``median_s``, ``kernel_s`` ...) and ``n``.
    """

    run: str
    key: str
    problem: dict[str, Any]
    pass_: int
    contender: str
    variant: dict[str, Any]
    target: str
    iree_version: str
    product_version: str
    device: str | None
    device_index: int | None
    held_out: bool
    verdict: str | None
    error: str | None
    times: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {("pass" if k == "pass_" else k): v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuning record") -> TuneRecord:
        """Raises ValueError naming ``where`` and the field: not an object, or a field missing."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        names = [("pass" if k == "pass_" else k) for k in cls.__dataclass_fields__]
        missing = next((n for n in names if n not in d), None)
        if missing:
            raise ValueError(f"{where}: missing field {missing!r}")
        return cls(*(d[n] for n in names))


class _Records:
    """One JSON object a line per measured candidate and pass, appended as each problem comes back."""

    def __init__(self, path: Path, fields: dict[str, Any]) -> None:
        self.path, self.fields = path, fields
        self.run = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"

    def append(self, row: dict[str, Any], device: str | None, passes: Collection[int] = (1, 2)) -> None:
        """The lines of ``row``'s ``passes`` (a row lands after pass 1, then again after pass 2)."""
        lines = []
        for tag, contenders in ((1, row["contenders"]), (2, row.get("pass2") or {})):
            for name, res in contenders.items() if tag in passes else ():
                rec = TuneRecord(self.run, row["key"], row["problem"], tag, name,
                                 row.get("variants", {}).get(name, {"name": name}), **self.fields, device=device,
                                 device_index=row.get("device_index"), held_out=row["held_out"],
                                 verdict=res.get("status"), error=res.get("error"),
                                 times={k: v for k, v in res.items() if k.endswith("_s") or k == "n"})  # fmt: skip
                lines.append(json.dumps(rec.to_dict()) + "\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:  # one writer (the parent); each problem's lines in one write
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())


def _time_problem(payload: dict, device: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Pass 1 of one problem and, where its top two are close, pass 2 (a measuring worker's task)."""
    folder, entry, held, timeout_s = Path(payload["folder"]), payload["entry"], payload["held"], payload["timeout_s"]
    one = _run_one(folder, entry, log, env=device.env, timeout_s=timeout_s, cudnn=payload.get("cudnn", False))
    row = _tune_fields(one["problems"][0], entry, held)
    again = _pass2_names(row)
    if again:
        row["pass2"] = _second_pass(folder, entry, again, log, env=device.env, timeout_s=timeout_s)
    row["device_index"] = device.index
    return {"row": row, "device": one["device"]}


def _tune_fields(row: dict[str, Any], entry: ManifestEntry, held: bool) -> dict[str, Any]:
    """``row`` (the runner's) with the fields the tuner adds: held out, the problem, the variants, the heuristic."""
    row["held_out"] = held
    row["problem"] = entry.problem
    row["variants"] = _variants(entry)
    row["heuristic"] = _heuristic(entry)
    if held:
        row["selected"] = entry.extra.get("selected")
    return row


def _pass2_names(row: dict[str, Any]) -> list[str]:
    """What pass 2 re-times: a tuned problem's top two where within :data:`PASS2_WITHIN`, and the heuristic's plan."""
    ranked = _ranked(row["contenders"])
    if row["held_out"] or len(ranked) < 2 or ranked[1][0] > ranked[0][0] * (1 + PASS2_WITHIN):
        return []
    again = [ranked[0][1], ranked[1][1]]
    if row["heuristic"] not in again and row["contenders"].get(row["heuristic"], {}).get("status") == "ok":
        again.append(row["heuristic"])
    return again


def _served_phase(run: _Run, payloads: list[dict]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each payload's ``(j, {"row", "device", "passes"})`` through ``run``'s servers: its pass-1 row as soon as it is
    timed (marked :data:`PASS2_PENDING` where pass 2 is due), then, after pass 1 of them all, the row again with its
    pass 2 (:class:`convbw_mlir.measure.server.Served`); appends each server run's summary to the results."""
    from convbw_mlir.measure.server import Served

    if not payloads:
        return
    options = _server_options(run.slots, payloads[0].get("cudnn", False))
    timeout_s = payloads[0]["timeout_s"]
    first = Served(run.folder, [p["entry"] for p in payloads], options, run.slots, timeout_s, run.log,
                   skip=lambda i: run.late(payloads[i]), pool=run.pool)  # fmt: skip
    rows: dict[int, tuple[dict[str, Any], str | None]] = {}
    summaries = run.results["server"]  # each server run's, as it stands when a row lands: a killed run's file has it
    summaries.append(first.summary())
    for i, (checked, device_name) in first:
        # the row as _run_one's one-device run writes it (no device_index), then the tuner's fields, as _time_problem
        row = _tune_fields(replace(checked, several_devices=False).to_dict(), payloads[i]["entry"], payloads[i]["held"])
        row["device_index"] = checked.device_index
        if again := _pass2_names(row):
            row[PASS2_PENDING] = again
        rows[i] = row, device_name
        summaries[-1] = first.summary()
        yield i, {"row": row, "device": device_name, "passes": (1,)}
    summaries[-1] = first.summary()
    order = [i for i in sorted(rows) if PASS2_PENDING in rows[i][0]]
    if order:  # checked on the float64 sample only, as _second_pass
        entries = [(e := payloads[i]["entry"]).with_contenders({n: e.contenders[n] for n in rows[i][0][PASS2_PENDING]})
                   for i in order]  # fmt: skip
        second = Served(run.folder, entries, options | {"numpy_max_flops": 0, "use_torch": False}, run.slots,
                        timeout_s, run.log, skip=lambda k: run.late_pass2(entries[k]), pool=run.pool)  # fmt: skip
        summaries.append(second.summary())
        for k, (checked, _) in second:
            row, device_name = rows[order[k]]
            row["pass2"] = checked.contenders
            del row[PASS2_PENDING]
            summaries[-1] = second.summary()
            yield order[k], {"row": row, "device": device_name, "passes": (2,)}
        summaries[-1] = second.summary()


def _lost_problem(payload: dict, why: str) -> dict[str, Any]:
    """The row of a problem whose measuring worker died: every candidate crashed, with why."""
    entry: ManifestEntry = payload["entry"]
    row = {"name": entry.name, "key": entry.key, "reference_error": why, "held_out": payload["held"],
           "contenders": {n: {"status": "crashed", "error": why} for n in entry.contenders if n != "reference"},
           "problem": entry.problem, "variants": _variants(entry), "heuristic": _heuristic(entry),
           "device_index": None}  # fmt: skip
    if payload["held"]:
        row["selected"] = entry.extra.get("selected")
    return {"row": row, "device": None}


def _variants(entry: ManifestEntry) -> dict[str, Any]:
    """The variant of each contender of ``entry`` that has one (IREE's forms and the reference have none)."""
    return {n: r["variant"] for n, r in entry.contenders.items() if "variant" in r}


def _heuristic(entry: ManifestEntry) -> str | None:
    """The contender of ``entry`` that is the heuristic's own plan."""
    return next((n for n, r in entry.contenders.items() if r.get("heuristic")), None)


def _device_name(name: str, slots: Sequence[Any] = ()) -> str:
    """The GPU's name where the runner reports only its driver (no torch): nvidia-smi's, else ``name``."""
    if name not in ("cuda", "hip"):
        return name
    import subprocess

    pinned = next((s.env["CUDA_VISIBLE_DEVICES"] for s in slots if "CUDA_VISIBLE_DEVICES" in s.env), None)
    cmd = (
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", *(["-i", pinned] if pinned else [])]
        if name == "cuda"
        else ["rocm-smi", "--showproductname"]
    )
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return name
    return out[0].strip() if out and name == "cuda" else name


def _located(folder: Path, rec: dict) -> dict:
    """A contender's record with its files (the vmfb, a direct launch's folder) named by path from ``folder``."""
    return rec | {k: str(folder / rec[k]) for k in ("vmfb", "launch") if rec.get(k)}


def _run_one(folder: Path, entry: ManifestEntry, log: Callable[[str], None], numpy_max_flops: float = NUMPY_MAX_FLOPS,
             env: dict[str, str] | None = None, timeout_s: float | None = None,
             cudnn: bool = False) -> dict:  # fmt: skip
    """The runner on one manifest entry (its kernels in ``folder``), through a one-problem manifest (and cuDNN
    after them, with ``cudnn``)."""
    from convbw_mlir.measure.run import STEP_TIMEOUT_S, run_manifest

    with tempfile.TemporaryDirectory(prefix="convbw-tune-") as tmp:
        contenders = {n: _located(folder, r) if r.get("ok") else r for n, r in entry.contenders.items()}
        target = json.loads((folder / "manifest.json").read_text())["target"]
        manifest = {"target": target, "iree_version": "", "problems": [entry.with_contenders(contenders).to_dict()]}
        (Path(tmp) / "manifest.json").write_text(json.dumps(manifest))
        return run_manifest(tmp, "", use_torch=cudnn, log=log, numpy_max_flops=numpy_max_flops,
                            timeout_s=timeout_s or STEP_TIMEOUT_S, env=env)  # fmt: skip


def _untuned_entry(entry: ManifestEntry, results: dict) -> ManifestEntry:
    """``entry`` cut to the untuned path: the heuristic, IREE's forms and the variant :func:`select` takes
    from the database of the problems tuned so far (``selected``: its name and path)."""
    from convbw_mlir.dispatch.select import select

    db = build_database(results, device=results["device"] or "device") if results["problems"] else None
    sel = select(entry.conv(), db.target if db else results["target"], dbs=[db] if db else [])
    keep = {n for n, r in entry.contenders.items() if r.get("heuristic") or n in IREE_FORMS or n == "reference"}
    chosen = next((n for n, r in entry.contenders.items()
                   if "variant" in r and Variant.from_dict(r["variant"]) == sel.variant), None)  # fmt: skip
    if chosen:
        keep.add(chosen)
    selected = {"name": chosen, "path": sel.path, "why": sel.why, "variant": sel.variant.to_dict()}
    return entry.with_contenders({n: r for n, r in entry.contenders.items() if n in keep}, selected=selected)


def _second_pass(folder: Path, entry: ManifestEntry, names: list[str], log: Callable[[str], None],
                 env: dict[str, str] | None = None, timeout_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The winner and the runner-up once more, in a fresh process, checked on the float64 sample only."""
    contenders = {n: entry.contenders[n] for n in names}
    one = _run_one(folder, entry.with_contenders(contenders), log, numpy_max_flops=0, env=env, timeout_s=timeout_s)
    return one["problems"][0]["contenders"]


def device_noise(results: dict[str, Any]) -> float | None:
    """The device's timing noise: the median over every re-timed kernel of |pass 2 - pass 1| / pass 1."""
    diffs = [abs(p2[m] - row["contenders"][n][m]) / row["contenders"][n][m]
             for row in results["problems"] for m in [_metric(row["contenders"], row.get("pass2") or {})]
             for n, p2 in (row.get("pass2") or {}).items()
             if p2.get("status") == "ok" and row["contenders"].get(n, {}).get("status") == "ok"]  # fmt: skip
    return statistics.median(diffs) if diffs else None


def _decide(row: dict[str, Any], noise_level: float | None = None, target: str | None = None) -> dict[str, Any]:
    """The winner of one problem's results, its noise and whether the top two swapped places in pass 2.

    With ``target``, an IREE form :func:`convbw_mlir.dispatch.variants.known_wrong` names never wins, even
    where its sampled check passed (a check samples dW; the rule holds for the whole class).

    Each kernel's time is the mean of its passes (pass 2 re-times the top two and the heuristic's plan).
    The fastest replaces the heuristic's plan only when faster by more than ``max(MIN_GAIN, noise_level)``.
    A row whose pass 2 was due and not run (:data:`PASS2_PENDING`: the run was cut) is decided on pass 1 alone,
    and ``why`` says so.
    """
    c = {n: r for n, r in row["contenders"].items() if n != CUDNN}
    if target is not None:
        problem = ConvBwdWeightProblem.from_dict(row["problem"])
        c = {n: r for n, r in c.items() if not known_wrong(problem, target, n)}
    p2 = {n: r for n, r in (row.get("pass2") or {}).items() if r.get("status") == "ok" and n in c}
    m = _metric(c, p2)
    ranked = _ranked(c, m)
    if not ranked:
        return {"winner": None}
    heur = row.get("heuristic")
    first, second = ranked[0][1], (ranked[1][1] if len(ranked) > 1 else None)
    times = {n: c[n][m] for _, n in ranked}
    for n, r in p2.items():  # both passes count
        times[n] = statistics.mean([c[n][m], r[m]])
    noise = max((abs(r[m] - c[n][m]) / c[n][m] for n, r in p2.items()), default=None)
    flipped = p2[second][m] < p2[first][m] if second and {first, second} <= p2.keys() else None
    winner = min(times, key=times.get)
    margin = max(MIN_GAIN, noise_level or 0.0)
    why = "fastest correct"
    if heur in times and winner != heur:
        gain = times[heur] / times[winner] - 1
        why = f"fastest correct, {gain:.1%} over the heuristic's plan (noise {margin:.1%})"
        if gain <= margin:
            why = f"{winner} was only {gain:.1%} faster (noise {margin:.1%}): the heuristic's plan kept"
            winner = heur
    if row.get(PASS2_PENDING):
        why += "; pass 1 only (its pass 2 was not run)"
    iree = [(times[n], n) for n in times if n in IREE_FORMS]
    default = [(times[n], n) for n in times if n in ("iree_direct", "iree_torch")]
    cud = row["contenders"].get(CUDNN, {})
    cudnn_s = cud.get(m) if cud.get("status") == "ok" else None
    return {"winner": winner, "cudnn_s": cudnn_s, "median_s": times[winner], "runner_up": second, "noise": noise,
            "flipped": flipped, "heuristic": heur, "heuristic_s": times.get(heur),
            "iree_best": min(iree) if iree else None, "iree_default": min(default) if default else None, "why": why,
            "times": times, "metric": m, "pass1_only": bool(row.get(PASS2_PENDING))}  # fmt: skip


def build_database(results: dict[str, Any], device: str | None = None) -> TuningDB:
    """The tuning database of ``results`` (from :func:`time_candidates`): held-out problems left out."""
    db = TuningDB(device or results["device"], results["target"], results["iree_version"])
    level = device_noise(results)
    for i, row in enumerate(results["problems"]):
        try:
            if row.get("held_out"):
                continue
            d = _decide(row, level, results["target"])
            if d["winner"] is None:
                continue
            name = d["winner"]
            variant = Variant.from_dict(row["variants"][name]) if name in row["variants"] else Variant(name)
            fields = {k: d[k] for k in ("median_s", "runner_up", "noise", "flipped", "heuristic_s", "why", "metric")}
            best = d["iree_best"]
            fields["iree_best"] = {"form": best[1], "median_s": best[0]} if best else None
            fields["measured"] = results["date"]
            if d["cudnn_s"]:  # cuDNN in the same process, same metric: the entry's ratio needs no other run
                fields["cudnn_s"] = d["cudnn_s"]
            db.add(ConvBwdWeightProblem.from_dict(row["problem"]), variant, **fields)
        except KeyError as e:
            raise DatabaseError(f"problems[{i}]: missing field {e}") from None
        except (AttributeError, TypeError, ValueError) as e:
            raise DatabaseError(f"problems[{i}]: {e}") from None
    return db


def database_from_results(results: Any, source: str = "<results>") -> TuningDB:
    """:func:`build_database` of a timing results file read from ``source``, every error naming it.

    Raises:
        DatabaseError: not a results object, a missing or bad field (naming ``source`` and the row).
    """
    if not isinstance(results, dict):
        raise DatabaseError(f"timing results {source}: expected an object, got {type(results).__name__}")
    check_header(results, f"timing results {source}")
    for name, kind in (("problems", list), ("date", str)):
        if not isinstance(results.get(name), kind):
            raise DatabaseError(f"timing results {source}: {name}: expected a {kind.__name__}, "
                                f"got {results.get(name)!r}")  # fmt: skip
    if not all(isinstance(row, dict) for row in results["problems"]):
        raise DatabaseError(f"timing results {source}: problems: expected a list of objects")
    try:
        return build_database(results)
    except DatabaseError as e:
        raise DatabaseError(f"timing results {source}: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # device_noise over all rows
        raise DatabaseError(f"timing results {source}: {type(e).__name__}: {e}") from None


def summarize(results: dict[str, Any], db: TuningDB | None = None) -> str:
    """Markdown: per problem the winner, its gain over the heuristic and over IREE, noise and flips; the
    held-out problems through select (nearest or heuristic) against the same; geomeans."""
    from convbw_mlir.dispatch.select import select

    db = db or build_database(results)
    lines = ["| problem | split | winner | µs | vs heuristic | vs best correct IREE | vs IREE default "
             "| noise | flip | select path |", "|---|---|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    ratios: dict[str, list[float]] = {"tuned_vs_iree": [], "tuned_vs_default": [], "held_vs_iree": [],
                                      "held_vs_default": [], "held_heur_vs_default": []}  # fmt: skip
    flips = noisy = pass1_only = 0
    level = device_noise(results)
    for row in results["problems"]:
        d = _decide(row, level, results["target"])
        if d["winner"] is None:
            lines.append(f"| {row['name']} | | none correct | | | | | | | |")
            continue
        problem = ConvBwdWeightProblem.from_dict(row["problem"])
        t, path = d["median_s"], "exact"
        if row.get("held_out"):
            sel = row.get("selected")  # what select chose on the GPU machine, from the problems tuned before
            if sel is None:
                s = select(problem, results["target"], dbs=[db])
                sel = {"path": s.path, "variant": s.variant.to_dict(), "name": None}
                sel["name"] = next((n for n, v in row["variants"].items() if Variant.from_dict(v) == s.variant), None)
            path, name = sel["path"], sel["name"]
            t = d["times"].get(name) if name else None
            if t is None:
                shown = Variant.from_dict(sel["variant"]).name
                lines.append(f"| {row['name']} | held out | {shown} not compiled | | | | | | | {path} |")
                continue
            shown = name
        else:
            shown = d["winner"]
        vs_h = d["heuristic_s"] / t if d["heuristic_s"] else None
        vs_i = d["iree_best"][0] / t if d["iree_best"] else None
        vs_d = d["iree_default"][0] / t if d["iree_default"] else None
        tag = "held_" if row.get("held_out") else "tuned_"
        if vs_i:
            ratios[f"{tag}vs_iree"].append(vs_i)
        if vs_d:
            ratios[f"{tag}vs_default"].append(vs_d)
        if row.get("held_out") and d["heuristic_s"] and d["iree_default"]:
            ratios["held_heur_vs_default"].append(d["iree_default"][0] / d["heuristic_s"])
        flips += bool(d["flipped"])
        pass1_only += d["pass1_only"]
        noisy += d["flipped"] is not None
        f = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
        noise = f"{d['noise']:.1%}" if d["noise"] is not None else "n/a"
        split = "held out" if row.get("held_out") else "tuned"
        flip = "yes" if d["flipped"] else ""
        lines.append(f"| {row['name']} | {split} | {shown} | {t * 1e6:.1f} | {f(vs_h)} | {f(vs_i)} | {f(vs_d)} "
                     f"| {noise} | {flip} | {path} |")  # fmt: skip
    gm = lambda xs: statistics.geometric_mean(xs) if xs else float("nan")  # noqa: E731
    metrics = [_decide(row, level, results["target"]).get("metric") for row in results["problems"]]
    lines += [
        "",
        f"times: GPU kernel time a call by CUPTI on {metrics.count('kernel_s')} problems, the call's time through "
        f"IREE's runtime on {metrics.count('median_s')} (docs/decisions.md#kernel-time)",
        "",
        f"order flips in pass 2: {flips} of {noisy} problems re-timed; device noise (median "
        f"|pass 2 - pass 1| / pass 1 over re-timed kernels): {level or 0:.1%}",
        "",
    ]
    if pass1_only:
        lines += [f"pass 1 only: {pass1_only} problems whose pass 2 was due and not run (the run was cut)", ""]
    for k, xs in ratios.items():
        lines.append(f"- {k}: geomean {gm(xs):.2f}x over {len(xs)} problems, min {min(xs, default=float('nan')):.2f}x, "
                     f"{sum(x < 1.0 for x in xs)} below 1.0x")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m convbw_mlir.dispatch.tune DIR --out results.json``: the timing half (runtime only)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m convbw_mlir.dispatch.tune", description=main.__doc__)
    ap.add_argument("folder")
    ap.add_argument("--out", required=True, help="results JSON; the database and summary are written beside it")
    ap.add_argument("--filter", default="")
    ap.add_argument("--deadline", type=float, default=None,
                    help="the run's budget in seconds: no problem starts that would not end within it, its pass 2 "
                    "included (estimated from the problems timed so far)")  # fmt: skip
    ap.add_argument("--devices", default=None, help=DEVICES_HELP)
    ap.add_argument("--timeout", type=float, default=None, help="seconds one candidate may run (default 600)")
    ap.add_argument("--server", action="store_true",
                    help="one measuring process a GPU, candidates checked once and timed in batches")  # fmt: skip
    ap.add_argument("--cudnn", action="store_true",
                    help="cuDNN timed after each problem's candidates, one process: entries get cudnn_s")  # fmt: skip
    args = ap.parse_args(argv)
    from convbw_mlir.measure.run import manifest_entries, read_manifest
    from convbw_mlir.targets import get_target

    try:
        manifest = read_manifest(args.folder)  # a missing or malformed manifest: one line, before any timing
        manifest_entries(manifest, args.folder)
        devices = parse_devices(args.devices) if args.devices is not None else None
        resolve_devices(get_target(manifest["target"]).driver, devices)  # no GPU here: one line, too
        if args.timeout is not None and not args.timeout > 0:
            raise ValueError(f"--timeout: expected seconds > 0, got {args.timeout}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    results = time_candidates(args.folder, args.out, args.filter, deadline_s=args.deadline, devices=devices,
                              timeout_s=args.timeout, server=args.server, cudnn=args.cudnn)  # fmt: skip
    db = build_database(results)
    out = Path(args.out)
    from convbw_mlir.dispatch.db import db_file_name

    db.save(out.parent / db_file_name(db.device, db.target))
    (out.with_suffix(".md")).write_text(summarize(results, db))
    print(f"wrote {out}, {db_file_name(db.device, db.target)} ({len(db.entries)} entries)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
