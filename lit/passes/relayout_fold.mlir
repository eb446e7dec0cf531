// RUN: %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-plan{target=sm_90a fold-rank=true},convbw-relayout)' | FileCheck %s

// 1 x kh x kw, depth stride 1, no depth padding (R(2+1)D's spatial conv): the depth joins the batch. x and dy are
// collapsed, dW expanded back: reshapes alone, no copy, no barrier; the op is the 2-D twin's, its plan fold_rank.
// CHECK-LABEL: func.func @depth
// CHECK-NOT: linalg.transpose
// CHECK-NOT: util.optimization_barrier
// CHECK: %[[X:.+]] = tensor.collapse_shape %arg0 {{\[\[}}0, 1], [2], [3], [4], [5]] : tensor<2x5x7x9x2x64xf16> into tensor<10x7x9x2x64xf16>
// CHECK: %[[DY:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0, 1], [2], [3], [4], [5]] : tensor<2x5x4x9x2x64xf16> into tensor<10x4x9x2x64xf16>
// CHECK: %[[W:.+]] = "convbw.conv_bwd_weight"(%[[X]], %[[DY]]) {dilations = array<i64: 1, 1>, {{.*}}pad_low = array<i64: 1, 1>, plan = {fold_rank = true{{.*}}strides = array<i64: 2, 1>} : (tensor<10x7x9x2x64xf16>, tensor<10x4x9x2x64xf16>) -> tensor<2x64x3x3x64xf16>
// CHECK: %[[DW:.+]] = tensor.expand_shape %[[W]] {{\[\[}}0], [1], [2, 3], [4], [5]] output_shape [2, 64, 1, 3, 3, 64] : tensor<2x64x3x3x64xf16> into tensor<2x64x1x3x3x64xf16>
// CHECK: return %[[DW]]
func.func @depth(%arg0: tensor<2x5x7x9x2x64xf16>, %arg1: tensor<2x5x4x9x2x64xf16>) -> tensor<2x64x1x3x3x64xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1, 1>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 1, 1>, pad_low = array<i64: 0, 1, 1>, strides = array<i64: 1, 2, 1>} : (tensor<2x5x7x9x2x64xf16>, tensor<2x5x4x9x2x64xf16>) -> tensor<2x64x1x3x3x64xf16>
  return %0 : tensor<2x64x1x3x3x64xf16>
}

// -----

// kd x 1 x 1, H and W unstrided and unpadded (R(2+1)D's temporal conv): H and W are one axis of H*W positions;
// the twin's filter is (kd, 1), its stride, dilation and padding the depth's and 1 / 0.
// CHECK-LABEL: func.func @plane
// CHECK-NOT: linalg.transpose
// CHECK: %[[X:.+]] = tensor.collapse_shape %arg0 {{\[\[}}0], [1], [2, 3], [4], [5]] : tensor<2x7x5x3x1x64xf16> into tensor<2x7x15x1x64xf16>
// CHECK: %[[DY:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0], [1], [2, 3], [4], [5]] : tensor<2x3x5x3x1x64xf16> into tensor<2x3x15x1x64xf16>
// CHECK: "convbw.conv_bwd_weight"(%[[X]], %[[DY]]) {dilations = array<i64: 2, 1>, {{.*}}pad_high = array<i64: 2, 0>, pad_low = array<i64: 1, 0>, plan = {fold_rank = true{{.*}}strides = array<i64: 2, 1>} : (tensor<2x7x15x1x64xf16>, tensor<2x3x15x1x64xf16>) -> tensor<1x64x3x1x64xf16>
// CHECK: tensor.expand_shape %{{.+}} {{\[\[}}0], [1], [2], [3], [4, 5]] output_shape [1, 64, 3, 1, 1, 64] : tensor<1x64x3x1x64xf16> into tensor<1x64x3x1x1x64xf16>
func.func @plane(%arg0: tensor<2x7x5x3x1x64xf16>, %arg1: tensor<2x3x5x3x1x64xf16>) -> tensor<1x64x3x1x1x64xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 2, 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 2, 0, 0>, pad_low = array<i64: 1, 0, 0>, strides = array<i64: 2, 1, 1>} : (tensor<2x7x5x3x1x64xf16>, tensor<2x3x5x3x1x64xf16>) -> tensor<1x64x3x1x1x64xf16>
  return %0 : tensor<1x64x3x1x1x64xf16>
}

// -----

// PyTorch's channels-last 3-D (NDHWC, G = 1): its unit G first (the grouped twin), then the fold; dW loses its unit
// G last. Every step a reshape.
// CHECK-LABEL: func.func @channels_last
// CHECK-NOT: linalg.transpose
// CHECK: tensor.expand_shape %arg0
// CHECK: tensor.collapse_shape %{{.+}} {{\[\[}}0, 1], [2], [3], [4], [5]] : tensor<2x5x7x9x1x64xf16> into tensor<10x7x9x1x64xf16>
// CHECK: "convbw.conv_bwd_weight"({{.*}}layout = "NHWGC/GKYXC/NHWGK"{{.*}} -> tensor<1x64x3x3x64xf16>
// CHECK: tensor.expand_shape %{{.+}} : tensor<1x64x3x3x64xf16> into tensor<1x64x1x3x3x64xf16>
// CHECK: tensor.collapse_shape %{{.+}} : tensor<1x64x1x3x3x64xf16> into tensor<64x1x3x3x64xf16>
func.func @channels_last(%arg0: tensor<2x5x7x9x64xf16>, %arg1: tensor<2x5x7x9x64xf16>) -> tensor<64x1x3x3x64xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1, 1>, groups = 1 : i64, layout = "NHWC/KYXC/NHWK", pad_high = array<i64: 0, 1, 1>, pad_low = array<i64: 0, 1, 1>, strides = array<i64: 1, 1, 1>} : (tensor<2x5x7x9x64xf16>, tensor<2x5x7x9x64xf16>) -> tensor<64x1x3x3x64xf16>
  return %0 : tensor<64x1x3x3x64xf16>
}
