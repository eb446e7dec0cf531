# RUN: %PYTHON %s | FileCheck %s
# Every GPU target of the table (convbw_mlir.targets.TARGETS, read when this runs, so a new entry is checked
# with no edit here): our pipeline compiles the RetinaNet head (f16, K=C=256, 13x13, no split), its main
# kernel uses the matrix instruction its plan names (the target's preferred one, or our kernel's: sm_90a's
# wgmma), spelled as the table's mnemonic, and nothing spills.

from convbw_mlir.build.compile import lowered_text
from convbw_mlir.build.iree import executable_intermediates
from convbw_mlir.build.isa import report
from convbw_mlir.pipelines import for_target
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import gpu_targets

# CHECK-LABEL: TEST: every GPU target of the table
# CHECK-NOT: MISMATCH
# CHECK: checked {{[1-9][0-9]*}} targets
print("TEST: every GPU target of the table")
retinanet = ConvBwdWeightProblem.from_ck("2 1 2 256 256 3 3 13 13 1 1 1 1 1 1 1 1")
targets = gpu_targets()
for t in targets:
    rep = report(executable_intermediates(lowered_text(retinanet, for_target(t.name)), t.name).files, t.name)
    plan = decide(retinanet, t.name)
    named = plan.tile.intrinsic if plan.tile else t.intrinsics["f16"][0].name
    expected = next(i.mnemonic for i in t.intrinsics["f16"] if i.name == named)
    found = sorted(rep.main.mma)
    ok = expected in found and rep.scratch_bytes == 0
    print(f"{t.name}: {'ok' if ok else 'MISMATCH'}: expected {expected}, found {found}, scratch {rep.scratch_bytes} B")
print(f"checked {len(targets)} targets")
