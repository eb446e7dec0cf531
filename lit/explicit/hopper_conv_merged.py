# The sm_90a weight gradient's boxed form for thin groups (ConvSm90.merge = 16: ResNeXt's 4-channel groups): 16
# groups share one 64-channel im2col box a tap and 64 GEMM rows; the grid's z runs over boxes of groups, and the
# store keeps the block diagonal only (a group's rows with its own channels).
# RUN: %PYTHON %s | FileCheck %s
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

g = ConvSm90(n=2, h=8, w=8, c=4, k=4, fy=3, fx=3, ho=8, wo=8, pad=(1, 1), groups=32, merge=16,
             tiling=Sm90Tiling(bn=192, consumers=1, stages=4))  # fmt: skip
with new_context(), ir.Location.unknown():
    module = conv_module(g)
    assert module.operation.verify()
    print(module)
# grid: 9 taps x 64 = 576 GEMM columns in 3 tiles of 192, 16 x 4 = 64 rows in one, 32 / 16 = 2 boxes of groups
# CHECK: hal.return %c3, %c1, %c2 : index, index, index
# CHECK: binding(0) {{.*}} : memref<128x128xf16>
# CHECK: binding(1) {{.*}} : memref<2x8x8x128xf16>
# CHECK: binding(3) {{.*}} : memref<32x4x36xf32>
# the producer: each box of x starts at the box's first group's first channel (64 per box of 16 groups)
# CHECK: %[[BOXCOL:.*]] = arith.remui {{.*}}, %c576_i32 : i32
# CHECK: arith.muli %{{.*}}, %c64_i32 : i32
# CHECK: arith.divui %[[BOXCOL]], %c64_i32{{.*}} : i32
# CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global {{.*}} im2col[{{.*}}] mode = im2col
# the store: a pair only where its row's group (row / K) is its column's group ((column % 64) / C), inside G
# and the filter's taps
# CHECK: arith.cmpi ult, %{{.*}}, %c576 : index
# CHECK: arith.divui %{{.*}}, %c4{{.*}} : index
# CHECK: arith.cmpi ult, %{{.*}}, %c32{{.*}} : index
# CHECK: %[[SAME:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
# CHECK: %[[OK:.*]] = arith.andi %{{.*}}, %[[SAME]] : i1
# CHECK-NEXT: scf.if %[[OK]] {
# CHECK: vector.store {{.*}} : memref<32x4x36xf32>, vector<2xf32>
