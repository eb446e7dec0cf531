# StreamK on the sm_90a weight gradient (convbw_mlir/kernels/conv_sm90.py, ConvSm90.streamk): a 3x3 layer's 5
# column tiles of 2 k tiles on 3 persistent workgroups. The IR: the workspace tied through the dispatch (flags
# zeroed by a fill), the segment loop, the contributor's partial store and flag, the finisher's spin on its
# contributors' flags (reset after), the consumer warpgroup's named barrier; the PTX IREE 3.13 makes of it.
# RUN: %PYTHON %s | FileCheck %s
import tempfile
from pathlib import Path

from convbw_mlir.build.iree import compile_module
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

g = ConvSm90(n=2, h=5, w=7, c=64, k=128, fy=3, fx=3, ho=5, wo=7, pad=(1, 1),
             tiling=Sm90Tiling(bn=128, stages=2), streamk=3)  # fmt: skip
with new_context(), ir.Location.unknown():
    module = conv_module(g)
    assert module.operation.verify()
    text = str(module)
print("TEST: ir")
print(text)
# CHECK-LABEL: TEST: ir
# dy, x, maps read-only; partials [workgroups, consumers, bn / 8, 128 threads, 4] f32, flags [workgroups,
# consumers] i32 and dW written
# CHECK: #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>,
# CHECK-SAME: #hal.pipeline.binding<storage_buffer>, #hal.pipeline.binding<storage_buffer>]>
# CHECK: binding(3) {{.*}} : memref<3x2x16x128x4xf32>
# CHECK: binding(4) {{.*}} : memref<3x2xi32>
# the finisher: one thread spins on each contributor's flag and puts it back to zero; membar.gl, the consumer
# warpgroup's named barrier (128 threads); then the contributors' partials added
# CHECK: scf.while
# CHECK: memref.atomic_rmw addi %c0_i32
# CHECK: memref.atomic_rmw addi %c-1_i32
# CHECK: nvvm.memory.barrier gpu
# CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c128_i32
# CHECK: vector.load {{.*}} : memref<3x2x16x128x4xf32>, vector<4xf32>
# a contributor: its partial in 16-byte chunks (thread order), membar.gl, the barrier, then one thread's flag
# CHECK: vector.store {{.*}}[%block_id_x, {{.*}} : memref<3x2x16x128x4xf32>, vector<4xf32>
# CHECK: nvvm.memory.barrier gpu
# CHECK: nvvm.barrier id
# CHECK: memref.atomic_rmw addi %c1_i32
# the module: the flags zeroed by a fill, partials and flags tied through the dispatch
# CHECK-LABEL: func.func @main
# CHECK: linalg.fill {{.*}} -> tensor<3x2xi32>
# CHECK: flow.dispatch @conv_sm90::@conv_sm90({{.*}}) : {{.*}} -> (tensor<1x128x576xf32>, %{{.*}}, %{{.*}})

with tempfile.TemporaryDirectory() as tmp:
    compile_module(text, "sm_90a", [f"--iree-hal-dump-executable-binaries-to={tmp}"])
    (ptx,) = Path(tmp).glob("*.ptx")
    print("TEST: ptx")
    print(ptx.read_text())
# CHECK-LABEL: TEST: ptx
# CHECK: .target sm_90a
# CHECK-DAG: membar.gl;
# CHECK-DAG: bar.sync {{.*}}, 128;
# CHECK-DAG: atom.acq_rel.sys.global.or.b32
# CHECK-DAG: atom.acq_rel.sys.global.add.u32 {{.*}}, -1;
# the partials: 16-byte loads and stores, 2048 bytes apart (128 threads x 16 bytes: coalesced)
# CHECK-DAG: st.global.v4.{{[bf]}}32
# CHECK-DAG: ld.global.v4.b32 {{.*}}+2048];
