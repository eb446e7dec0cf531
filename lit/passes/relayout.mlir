// RUN: %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-relayout)' | FileCheck %s

// Layout 1 (GNHWC, the group outermost): x and dy transposed to layout 2 (NHWGC), each behind an
// optimization barrier; the op is the layout-2 op on them, with the same dW.
// CHECK-LABEL: func.func @layout1
// CHECK: %[[XT:.+]] = linalg.transpose ins(%arg0 : tensor<2x4x9x9x8xf16>) outs(%{{.+}} : tensor<4x9x9x2x8xf16>) permutation = [1, 2, 3, 0, 4]
// CHECK: %[[X:.+]] = util.optimization_barrier %[[XT]] : tensor<4x9x9x2x8xf16>
// CHECK: %[[DT:.+]] = linalg.transpose ins(%arg1 : tensor<2x4x7x7x16xf16>) outs(%{{.+}} : tensor<4x7x7x2x16xf16>) permutation = [1, 2, 3, 0, 4]
// CHECK: %[[DY:.+]] = util.optimization_barrier %[[DT]] : tensor<4x7x7x2x16xf16>
// CHECK: "convbw.conv_bwd_weight"(%[[X]], %[[DY]]) {{.*}}layout = "NHWGC/GKYXC/NHWGK"{{.*}} -> tensor<2x16x3x3x8xf16>
func.func @layout1(%arg0: tensor<2x4x9x9x8xf16>, %arg1: tensor<2x4x7x7x16xf16>) -> tensor<2x16x3x3x8xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "GNHWC/GKYXC/GNHWK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<2x4x9x9x8xf16>, tensor<2x4x7x7x16xf16>) -> tensor<2x16x3x3x8xf16>
  return %0 : tensor<2x16x3x3x8xf16>
}

// -----

// A layout-3 convolution (NGCHW x, GKYXC dW) too.
// CHECK-LABEL: func.func @layout3_conv
// CHECK: linalg.transpose ins(%arg0 : tensor<4x2x8x9x9xf16>) outs(%{{.+}} : tensor<4x9x9x2x8xf16>) permutation = [0, 3, 4, 1, 2]
// CHECK: "convbw.conv_bwd_weight"({{.*}}layout = "NHWGC/GKYXC/NHWGK"
func.func @layout3_conv(%arg0: tensor<4x2x8x9x9xf16>, %arg1: tensor<4x2x16x7x7xf16>) -> tensor<2x16x3x3x8xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NGCHW/GKYXC/NGKHW", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x2x8x9x9xf16>, tensor<4x2x16x7x7xf16>) -> tensor<2x16x3x3x8xf16>
  return %0 : tensor<2x16x3x3x8xf16>
}

// -----

// A layout-3 1x1 stays as it is: its GEMM reads the reduction innermost, a form IREE was right on.
// CHECK-LABEL: func.func @layout3_1x1
// CHECK-NOT: linalg.transpose
// CHECK: layout = "NGCHW/GKYXC/NGKHW"
func.func @layout3_1x1(%arg0: tensor<4x2x8x9x9xf16>, %arg1: tensor<4x2x16x9x9xf16>) -> tensor<2x16x1x1x8xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NGCHW/GKYXC/NGKHW", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x2x8x9x9xf16>, tensor<4x2x16x9x9xf16>) -> tensor<2x16x1x1x8xf16>
  return %0 : tensor<2x16x1x1x8xf16>
}

// -----

// Channels-last without G (NHWC/KYXC/NHWK) is layout 2 with G = 1, byte for byte: x and dy gain a unit G by
// reshapes (no copy, no barrier), the op is the layout-2 op, dW loses its unit G again.
// CHECK-LABEL: func.func @channels_last
// CHECK-NOT: linalg.transpose
// CHECK-DAG: %[[X:.+]] = tensor.expand_shape %arg0 {{\[}}[0], [1], [2], [3, 4]] output_shape [4, 9, 9, 1, 8] : tensor<4x9x9x8xf16> into tensor<4x9x9x1x8xf16>
// CHECK-DAG: %[[DY:.+]] = tensor.expand_shape %arg1 {{\[}}[0], [1], [2], [3, 4]] output_shape [4, 7, 7, 1, 16] : tensor<4x7x7x16xf16> into tensor<4x7x7x1x16xf16>
// CHECK: %[[DW:.+]] = "convbw.conv_bwd_weight"(%[[X]], %[[DY]]) {{.*}}layout = "NHWGC/GKYXC/NHWGK"{{.*}} -> tensor<1x16x3x3x8xf16>
// CHECK: %[[OUT:.+]] = tensor.collapse_shape %[[DW]] {{\[}}[0, 1], [2], [3], [4]] : tensor<1x16x3x3x8xf16> into tensor<16x3x3x8xf16>
// CHECK: return %[[OUT]]
func.func @channels_last(%arg0: tensor<4x9x9x8xf16>, %arg1: tensor<4x7x7x16xf16>) -> tensor<16x3x3x8xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWC/KYXC/NHWK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x9x9x8xf16>, tensor<4x7x7x16xf16>) -> tensor<16x3x3x8xf16>
  return %0 : tensor<16x3x3x8xf16>
}

// -----

// PyTorch's contiguous format (NCHW/KCYX/NKHW) is layout 4 with G = 1 the same way.
// CHECK-LABEL: func.func @torch_contiguous
// CHECK-NOT: linalg.transpose
// CHECK-DAG: tensor.expand_shape %arg0 {{\[}}[0], [1, 2], [3], [4]] output_shape [4, 1, 8, 9, 9] : tensor<4x8x9x9xf16> into tensor<4x1x8x9x9xf16>
// CHECK: "convbw.conv_bwd_weight"({{.*}}layout = "NGCHW/GKCYX/NGKHW"{{.*}} -> tensor<1x16x8x3x3xf16>
// CHECK: tensor.collapse_shape {{.*}} : tensor<1x16x8x3x3xf16> into tensor<16x8x3x3xf16>
func.func @torch_contiguous(%arg0: tensor<4x8x9x9xf16>, %arg1: tensor<4x16x7x7xf16>) -> tensor<16x8x3x3xf16> {
  %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NCHW/KCYX/NKHW", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x8x9x9xf16>, tensor<4x16x7x7xf16>) -> tensor<16x8x3x3xf16>
  return %0 : tensor<16x8x3x3xf16>
}
