# The split sum (stage 2) of an explicit split plan as IREE 3.13 compiles it for sm_90a (docs/decisions.md
# #short-reduction-dense item 2): one dispatch (sum, rounding); where the outputs are not a multiple of 128 our tile
# (policies/split.py sum_tile: 888 x 888 -> 222 threads x 4 f32, 16-byte loads of each split), where they are,
# IREE's own (32 x 4). IREE's own at 888 x 888 was 32 x 1: 4-byte loads (`ld.global.nc.b32`).
# RUN: %PYTHON %s | FileCheck %s
import re
import tempfile
from pathlib import Path

from convbw_mlir import compile_op
from convbw_mlir.build.iree import compile_module
from convbw_mlir.problem import ConvBwdWeightProblem as P


def stage_two(name: str, p: P, k_batch: int) -> None:
    """The stage-2 dispatch's tile, workgroup and the global loads and stores of its PTX entry."""
    op = compile_op(p, "sm_90a", strategy="explicit", k_batch=k_batch, cache=False)
    with tempfile.TemporaryDirectory() as tmp:
        compile_module(
            op.stages["linalg"],
            "sm_90a",
            [f"--iree-hal-dump-executable-binaries-to={tmp}", f"--iree-hal-dump-executable-configurations-to={tmp}"],
        )
        configs = sorted(Path(tmp).glob("configured_*dispatch_*.mlir"))
        (ptx,) = Path(tmp).glob("*.ptx")
        print(f"TEST: {name}")
        print("stage-2 dispatches:", len(configs))
        for c in configs:
            text = c.read_text()
            print(re.search(r"lowering_config<\{[^}]*\}>", text).group(0))
            print(re.search(r"workgroup_size = \[[^\]]*\]", text).group(0))
        entry = ptx.read_text().split(".entry conv_bwd_weight_dispatch_0")[1].split(".entry")[0]
        for line in entry.splitlines():
            if re.search(r"\b(ld|st)\.global", line):
                print(line.strip().split()[0])


# RegNetY-016's 888 -> 888 1x1 (bf16, split 2; the sm_80 kernel)
stage_two("888", P(1, 32, 888, 888, (7, 7), (1, 1), layout=2, dtype="bf16", dw_dtype="bf16"), 2)
# CHECK-LABEL: TEST: 888
# CHECK-NEXT: stage-2 dispatches: 1
# CHECK-NEXT: lowering_config<{reduction = [0, 2], thread = [4, 0], workgroup = [888, 0]}>
# CHECK-NEXT: workgroup_size = [222, 1, 1]
# CHECK-NEXT: ld.global.nc.v4.b32
# CHECK-NEXT: ld.global.nc.v4.b32
# CHECK-NEXT: st.global.v4.b16
# CHECK-NOT: ld.global

# 128 -> 256 (f16, split 3): 32,768 outputs, a multiple of 128: IREE's own tile
stage_two("128x256", P(1, 32, 128, 256, (7, 7), (1, 1), layout=2, dtype="f16"), 3)
# CHECK-LABEL: TEST: 128x256
# CHECK-NEXT: stage-2 dispatches: 1
# CHECK-NEXT: lowering_config<{reduction = [0, 3], thread = [4, 0], workgroup = [128, 0]}>
# CHECK-NEXT: workgroup_size = [32, 1, 1]
# CHECK-NEXT: ld.global.nc.v4.b32
# CHECK-NEXT: ld.global.nc.v4.b32
# CHECK-NEXT: ld.global.nc.v4.b32
# CHECK-NEXT: st.global.v2.b32
