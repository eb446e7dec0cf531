// RUN: %convbw-opt %s --pass-pipeline='builtin.module(convbw-explicit-gemm,convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s

// A 1x1 with stride 2: x is copied at o * 2 (7x7 -> 4x4) by an elementwise generic behind an optimization
// barrier (IREE must not fuse it into the GEMM), then the plain GEMM (batch and spatial dims one reduction loop, dy first).
// CHECK-DAG: #[[SUB:.+]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 * 2, d2 * 2, d3, d4)>
// CHECK: %[[XS:.+]] = linalg.generic {indexing_maps = [#[[SUB]], #{{.+}}]{{.*}} ins(%arg0 : tensor<4x7x7x2x16xf16>) outs(%{{.+}} : tensor<4x4x4x2x16xf16>)
// CHECK: %[[XB:.+]] = util.optimization_barrier %[[XS]] : tensor<4x4x4x2x16xf16>
// CHECK: %[[DY:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x4x4x2x8xf16> into tensor<64x2x8xf16>
// CHECK: %[[X:.+]] = tensor.collapse_shape %[[XB]] {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x4x4x2x16xf16> into tensor<64x2x16xf16>
// CHECK: linalg.generic {{.*}} ins(%[[DY]], %[[X]] : tensor<64x2x8xf16>, tensor<64x2x16xf16>)
// CHECK-SAME: loops = ["g", "k", "c", "n*o0"]
func.func @conv_bwd_weight(%arg0: tensor<4x7x7x2x16xf16>, %arg1: tensor<4x4x4x2x8xf16>) -> tensor<2x8x1x1x16xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 2, 2>} : (tensor<4x7x7x2x16xf16>, tensor<4x4x4x2x8xf16>) -> tensor<2x8x1x1x16xf16>
  return %0 : tensor<2x8x1x1x16xf16>
}
