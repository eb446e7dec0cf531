// RUN: %convbw-opt %S/Inputs/conv1x1.mlir --pass-pipeline='builtin.module(convbw-explicit-gemm)' | FileCheck %s
// RUN: %convbw-opt %S/Inputs/conv1x1.mlir --pass-pipeline='builtin.module(convbw-explicit-gemm,convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s --check-prefix=GEMM
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-explicit-gemm)' | FileCheck %s --check-prefix=NOT1X1

// A 1x1, stride-1, unpadded filter: spatial dims collapsed (no im2col), a 1-D filter-1 op, dW expanded.
// CHECK: %[[X:.+]] = tensor.collapse_shape %arg0 {{\[\[}}0], [1, 2], [3], [4]] : tensor<4x6x6x2x16xf16> into tensor<4x36x2x16xf16>
// CHECK: %[[DY:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0], [1, 2], [3], [4]] : tensor<4x6x6x2x8xf16> into tensor<4x36x2x8xf16>
// CHECK: %[[W:.+]] = "convbw.conv_bwd_weight"(%[[X]], %[[DY]]) {{.*}} -> tensor<2x8x1x16xf16>
// CHECK: tensor.expand_shape %[[W]] {{\[\[}}0], [1], [2, 3], [4]] output_shape [2, 8, 1, 1, 16]

// Lowered: a batched GEMM over groups, x's map is a projected permutation (no filter loop), and dy
// comes first (M = k from dy, N = c from x, in the accumulator's order). The batch and spatial loops are
// adjacent in both inputs, so they are one reduction loop (n*o0 = 4 * 36) and the inputs 2-D per group.
// GEMM-DAG: #[[DYM:.+]] = affine_map<(d0, d1, d2, d3) -> (d3, d0, d1)>
// GEMM-DAG: #[[XM:.+]] = affine_map<(d0, d1, d2, d3) -> (d3, d0, d2)>
// GEMM: %[[DY:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x6x6x2x8xf16> into tensor<144x2x8xf16>
// GEMM: %[[X:.+]] = tensor.collapse_shape %arg0 {{\[\[}}0, 1, 2], [3], [4]] : tensor<4x6x6x2x16xf16> into tensor<144x2x16xf16>
// GEMM: linalg.generic {indexing_maps = [#[[DYM]], #[[XM]], {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
// GEMM-SAME: ins(%[[DY]], %[[X]] : tensor<144x2x8xf16>, tensor<144x2x16xf16>)
// GEMM-SAME: loops = ["g", "k", "c", "n*o0"]

// NOT1X1-NOT: tensor.collapse_shape
