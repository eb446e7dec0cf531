"""Keep a cosmic-ray session to the functions its config names (the numerically critical ones).

``[cosmic-ray.filters.scope]`` maps a module path to the functions (or classes) whose mutants run;
every other mutant of the session is marked skipped. Run after ``cosmic-ray init``, before ``exec``:

    python tests/mutation/scope.py tests/mutation/kernels.toml session.sqlite
"""

from __future__ import annotations

import sys
from pathlib import Path

from cosmic_ray.config import load_config
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


def main(config_path: str, session: str) -> int:
    scope = {Path(k): set(v) for k, v in load_config(config_path).sub("filters", "scope").items()}
    kept = skipped = 0
    with use_db(session, WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            inside = all(m.definition_name in scope.get(Path(m.module_path), ()) for m in item.mutations)
            if inside:
                kept += 1
                continue
            db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
            skipped += 1
    print(f"{config_path}: {kept} mutants in scope, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
