"""The kernel dispatcher on the CPU: declare variants, build them in parallel, time them, select.

    python examples/dispatch_example.py          # about a minute on two cores

Uses a temporary cache and database, so it leaves nothing behind. The same calls with target "sm_80"
build GPU kernels; their timing half runs where the GPU is (docs/dispatch.md).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from convbw_mlir import ConvBwdWeightProblem

tmp = tempfile.mkdtemp(prefix="convbw-dispatch-example-")
os.environ["CONVBW_CACHE_DIR"] = tmp  # before compile_op runs: a private cache for this example

from convbw_mlir import compile_op  # noqa: E402
from convbw_mlir.dispatch import Registry, TuningDB, candidates, select  # noqa: E402
from convbw_mlir.dispatch.build import iree_version  # noqa: E402
from convbw_mlir.reference import assert_close, random_inputs, reference  # noqa: E402
from convbw_mlir.runtime import time_calls  # noqa: E402

problem = ConvBwdWeightProblem.from_ck("2 1 8 16 16 3 3 16 16 1 1 1 1 1 1 1 1")
target = "host"

# 1. Declared variants: the heuristic's plan first, then plans from the override grid.
variants = candidates(problem, target, max_plans=3)
for v in variants:
    print(f"variant {v.name}: k_batch={v.plan.k_batch} strategy={v.plan.strategy}")

# 2. A parallel build, each variant in its own child process, through the cache.
reg = Registry(target)
for v in variants:
    reg.declare(problem, v)
report = reg.build(max_workers=2)
print(report.table())

# 3. Time each built variant, check it against float64, keep the fastest correct one.
x, dy = random_inputs(problem)
want = reference(problem, x, dy)
db = TuningDB("local-task", target, iree_version())
timed = []
for r in report.results:
    assert_close(problem, r.op.run(x, dy), want)  # a wrong kernel is never selected
    kernel = r.op.kernel()
    xd, dyd = kernel.to_device(x), kernel.to_device(dy)
    seconds = statistics.median(time_calls(kernel, xd, dyd))
    timed.append((seconds, r.variant))
    print(f"{r.variant.name}: {seconds * 1e6:.1f} us")
best_s, best = min(timed, key=lambda t: t[0])
db.add(problem, best, median_s=best_s)
db.save(os.path.join(tmp, "tuning", "local-task.host.json"))  # where `convbw tune --import` puts databases

# 4. Select: an exact hit now; compile_op goes through select and the cache.
print("select:", select(problem, target))
op = compile_op(problem, target)
print("compile_op chose", op.selection.variant.name, "by", op.selection.path)
print("a neighbour:", select(problem.with_(batch=4), target))
shutil.rmtree(tmp)
