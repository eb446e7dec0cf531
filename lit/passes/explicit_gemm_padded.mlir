// RUN: %convbw-opt %s --pass-pipeline='builtin.module(convbw-explicit-gemm,convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s

// A 1x1 with stride 2 and padding 1 on 7x7: of the 5x5 output positions only 1..3 read x (rows 1, 3, 5),
// the others read padding. x is copied from row 1 at o * 2 and dy sliced at 1..3 (3x3 each), each behind an
// optimization barrier, then the plain GEMM over 4 x 9 positions: no padding and no stride left for IREE.
// CHECK-DAG: #[[XW:.+]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 * 2, d2 * 2, d3, d4)>
// CHECK: %[[XO:.+]] = tensor.extract_slice %arg0[0, 1, 1, 0, 0] [4, 5, 5, 2, 16] [1, 1, 1, 1, 1]
// CHECK: %[[XS:.+]] = linalg.generic {indexing_maps = [#[[XW]], #{{.+}}]{{.*}} ins(%[[XO]] : tensor<4x5x5x2x16xf16>) outs(%{{.+}} : tensor<4x3x3x2x16xf16>)
// CHECK: %[[XB:.+]] = util.optimization_barrier %[[XS]] : tensor<4x3x3x2x16xf16>
// CHECK: %[[DS:.+]] = tensor.extract_slice %arg1[0, 1, 1, 0, 0] [4, 3, 3, 2, 8] [1, 1, 1, 1, 1]
// CHECK: %[[DB:.+]] = util.optimization_barrier %[[DS]] : tensor<4x3x3x2x8xf16>
// CHECK-DAG: %[[DY:.+]] = tensor.collapse_shape %[[DB]] {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x3x3x2x8xf16> into tensor<36x2x8xf16>
// CHECK-DAG: %[[X:.+]] = tensor.collapse_shape %[[XB]] {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x3x3x2x16xf16> into tensor<36x2x16xf16>
// CHECK: linalg.generic {{.*}} ins(%[[DY]], %[[X]] : tensor<36x2x8xf16>, tensor<36x2x16xf16>)
// CHECK-SAME: loops = ["g", "k", "c", "n*o0"]
// CHECK-NOT: tensor.pad
func.func @conv_bwd_weight(%arg0: tensor<4x7x7x2x16xf16>, %arg1: tensor<4x5x5x2x8xf16>) -> tensor<2x8x1x1x16xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 3, 1>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 2, 2>} : (tensor<4x7x7x2x16xf16>, tensor<4x5x5x2x8xf16>) -> tensor<2x8x1x1x16xf16>
  return %0 : tensor<2x8x1x1x16xf16>
}
