// Each chunk is processed alone and the outputs are joined by the same marker; an error in one chunk
// does not stop the others, and the exit code says that one failed.
// RUN: not %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-lower-to-linalg)' > %t.out 2> %t.err
// RUN: FileCheck %s --input-file %t.out
// RUN: FileCheck %s --check-prefix=ERR --input-file %t.err

// CHECK-LABEL: func.func @first
// CHECK:       linalg.generic
// CHECK:       // -----
// CHECK-LABEL: func.func @third
// CHECK:       linalg.generic
// ERR:         split_input_file.mlir:21:8: error: 'convbw.conv_bwd_weight' op groups: must be positive, got 0
func.func @first(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @second(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 0 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @third(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}
