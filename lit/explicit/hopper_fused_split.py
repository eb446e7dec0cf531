# The sm_90a weight gradient's split with its second stage in the kernel (ConvSm90.fused): each consumer thread
# stores its partial, fences, counts in on its own counter, and the thread arriving last sums the splits'
# partials at its places and writes dW, then puts its counter back to zero.
# RUN: %PYTHON %s | FileCheck %s
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

g = ConvSm90(n=4, h=10, w=11, c=64, k=128, fy=3, fx=3, ho=10, wo=11, pad=(1, 1),
             tiling=Sm90Tiling(bn=128, stages=2), splits=3, fused=True)  # fmt: skip
with new_context(), ir.Location.unknown():
    module = conv_module(g)
    assert module.operation.verify()
    print(module)
# partials [splits, G, K, Y X C] f32, counters (5 tiles x 2 consumers x 128 threads) i32, dW (f32 here)
# CHECK: binding(3) {{.*}} : memref<3x1x128x576xf32>
# CHECK: binding(4) {{.*}} : memref<1280xi32>
# CHECK: binding(5) {{.*}} : memref<1x128x576xf32>
# the partial, membar.gl, the thread's own count
# CHECK: vector.store {{.*}} : memref<3x1x128x576xf32>, vector<2xf32>
# CHECK: nvvm.memory.barrier gpu
# CHECK: %[[SEEN:.*]] = memref.atomic_rmw addi %c1_i32{{.*}} : (i32, memref<1280xi32>) -> i32
# CHECK: arith.cmpi eq, %[[SEEN]], %c2_i32
# the last: the splits' partials summed at its places, dW written, the counter back to zero
# CHECK: nvvm.memory.barrier gpu
# CHECK: scf.for
# CHECK: vector.load {{.*}} : memref<3x1x128x576xf32>, vector<2xf32>
# CHECK: vector.store {{.*}} : memref<1x128x576xf32>, vector<2xf32>
# CHECK: memref.atomic_rmw addi %c-3_i32{{.*}} : (i32, memref<1280xi32>) -> i32
# CHECK-LABEL: func.func @main
# CHECK: linalg.fill {{.*}} -> tensor<1280xi32>
