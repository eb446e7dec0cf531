"""Keep a cosmic-ray session to the functions its config names, and report its score.

``[cosmic-ray.filters.scope]`` maps a module path to the functions (or classes) whose mutants run;
every other mutant of the session is marked skipped. Run after ``cosmic-ray init``, before ``exec``:

    python tests/mutation/scope.py tests/mutation/kernels.toml session.sqlite
    python tests/mutation/scope.py --report session.sqlite    # killed / run, and each survivor
    python tests/mutation/scope.py --recheck CONFIG session.sqlite  # survivors again, after new tests
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from cosmic_ray.config import load_config
from cosmic_ray.mutating import use_mutation
from cosmic_ray.plugins import get_operator
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult


def restrict(config_path: str, session: str) -> None:
    scope = {Path(k): set(v) for k, v in load_config(config_path).sub("filters", "scope").items()}
    kept = skipped = 0
    with use_db(session, WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            if all(m.definition_name in scope.get(Path(m.module_path), ()) for m in item.mutations):
                kept += 1
                continue
            db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
            skipped += 1
    print(f"{config_path}: {kept} mutants in scope, {skipped} skipped")


def report(session: str) -> None:
    killed, survivors, pending = 0, [], 0
    with use_db(session, WorkDB.Mode.open) as db:
        pending = db.num_work_items - db.num_results
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            if result.test_outcome == TestOutcome.SURVIVED:
                survivors.append(item)
            else:  # killed, or the mutant made the tests fail to run or time out
                killed += 1
    run = killed + len(survivors)
    print(f"{session}: {killed} of {run} mutants killed ({100 * killed / max(run, 1):.0f}%), {pending} not run")
    for item in survivors:
        for m in item.mutations:
            print(f"  survived: {m.module_path}:{m.start_pos[0]}:{m.start_pos[1]} {m.definition_name} "
                  f"{m.operator_name} #{m.occurrence}")  # fmt: skip


def recheck(config_path: str, session: str) -> None:
    """Run each survivor of ``session`` again with the config's test command; record the newly killed."""
    command = shlex.split(load_config(config_path)["test-command"])
    with use_db(session, WorkDB.Mode.open) as db:
        survivors = [i for i, r in db.completed_work_items if r.test_outcome == TestOutcome.SURVIVED]
        for item in survivors:
            (m,) = item.mutations
            with use_mutation(Path(m.module_path), get_operator(m.operator_name)(**m.operator_args), m.occurrence):
                failed = subprocess.run(command, capture_output=True).returncode != 0
            if failed:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.NORMAL,
                                                      test_outcome=TestOutcome.KILLED, output="recheck"))  # fmt: skip
            print(f"{m.module_path}:{m.start_pos[0]} {m.operator_name}: {'killed' if failed else 'survived'}")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2])
    elif sys.argv[1] == "--recheck":
        recheck(*sys.argv[2:4])
    else:
        restrict(*sys.argv[1:3])
