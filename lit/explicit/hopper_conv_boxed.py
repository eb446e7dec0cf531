# The sm_90a weight gradient's boxed form for medium groups (ConvSm90.merge = 1: RegNetY's 56-channel groups): one
# group a 64-channel im2col box a tap (its 8 channels past C belong to the next group, or read zeros past G C, and are
# never stored), K = 56 GEMM rows; the store maps GEMM column tap 64 + c to dW's tap C + c.
# RUN: %PYTHON %s | FileCheck %s
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

g = ConvSm90(n=4, h=7, w=7, c=56, k=56, fy=3, fx=3, ho=7, wo=7, pad=(1, 1), groups=3, merge=1, splits=2,
             tiling=Sm90Tiling(bn=192, consumers=1, stages=4))  # fmt: skip
with new_context(), ir.Location.unknown():
    module = conv_module(g, "bf16")
    assert module.operation.verify()
    print(module)
# grid: 576 GEMM columns in 3 tiles, 56 rows in one, 3 groups x 2 splits; the split's f32 partials in dW's order
# CHECK: hal.return %c3, %c1, %c6 : index, index, index
# CHECK: binding(0) {{.*}} : memref<196x168xbf16>
# CHECK: binding(1) {{.*}} : memref<4x7x7x168xbf16>
# CHECK: binding(3) {{.*}} : memref<2x3x56x504xf32>
# the producer: a group's x box starts at its first channel (56 g), one box a tap; its dy box at row 56 g
# CHECK: arith.muli %{{.*}}, %c56_i32 : i32
# CHECK: arith.muli %{{.*}}, %c56_i32{{.*}} : i32
# CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global {{.*}} im2col[{{.*}}] mode = im2col
# the store: dW's column tap * 56 + channel, a pair only where the column's channel lies inside the group
# CHECK: %[[TAP:.*]] = arith.divui %{{.*}}, %c64{{.*}} : index
# CHECK: %[[CH:.*]] = arith.remui %{{.*}}, %c64{{.*}} : index
# CHECK: arith.muli %[[TAP]], %c56{{.*}} : index
# CHECK: arith.remui %[[CH]], %c56{{.*}} : index
# CHECK: %[[SAME:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
# CHECK: %[[OK:.*]] = arith.andi %{{.*}}, %[[SAME]] : i1
# CHECK-NEXT: scf.if %[[OK]] {
# CHECK: vector.store {{.*}} : memref<2x3x56x504xf32>, vector<2xf32>
