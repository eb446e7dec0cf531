// RUN: %convbw-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(convbw-lower-to-linalg)'

// The convbw op's verifier: each malformed op gets one error at its location.

func.func @wrong_dw_shape(%x: tensor<2x7x9x2x3xf16>, %dy: tensor<2x3x7x2x5xf16>) -> tensor<2x5x3x3x4xf16> {
  // expected-error@+1 {{dw: expected shape 2x5x3x3x3 for this problem, got 2x5x3x3x4}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 2>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 2>, pad_low = array<i64: 1, 0>, strides = array<i64: 2, 1>} : (tensor<2x7x9x2x3xf16>, tensor<2x3x7x2x5xf16>) -> tensor<2x5x3x3x4xf16>
  return %0 : tensor<2x5x3x3x4xf16>
}

// -----

func.func @missing_attribute(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{missing attribute 'strides'}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @negative_pad(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{pad_low: pads must be non-negative, got (-1, 0)}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: -1, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @mixed_input_types(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xbf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{x and dy must share an element type, got f16 and bf16}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xbf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @grouped_torch_layout(%x: tensor<1x4x4x4xf16>, %dy: tensor<1x4x4x4xf16>) -> tensor<4x2x1x1xf16> {
  // expected-error@+1 {{layout: NCHW/KCYX/NKHW has no group dimension and needs groups=1, got groups=2}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NCHW/KCYX/NKHW", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x4xf16>, tensor<1x4x4x4xf16>) -> tensor<4x2x1x1xf16>
  return %0 : tensor<4x2x1x1xf16>
}

// -----

func.func @unknown_layout(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{layout: unknown layout 'NHWCG'}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWCG", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @dynamic_shape(%x: tensor<?x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{x: expected a static shape, got tensor<?x4x4x1x2xf16>}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<?x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @rows_split_unknown_loop(%x: tensor<2x8x128x16x1xf16>, %dy: tensor<2x8x128x16x1xf16>) -> tensor<16x16x1x3x3x1xf32> {
  // expected-error@+1 {{split_dim: 'n,o7' must name distinct reduction loops; loops: n, o0, o1}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 16 : i64, k_batch = 16 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, split_chunk = 1 : i64, split_dim = "n,o7", strides = array<i64: 1, 1>} : (tensor<2x8x128x16x1xf16>, tensor<2x8x128x16x1xf16>) -> tensor<16x16x1x3x3x1xf32>
  return %0 : tensor<16x16x1x3x3x1xf32>
}

// -----

func.func @rows_split_wrong_k_batch(%x: tensor<2x8x128x16x1xf16>, %dy: tensor<2x8x128x16x1xf16>) -> tensor<8x16x1x3x3x1xf32> {
  // expected-error@+1 {{split: k_batch 8 must be 16, the extents of n,o0 multiplied}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 16 : i64, k_batch = 8 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, split_chunk = 1 : i64, split_dim = "n,o0", strides = array<i64: 1, 1>} : (tensor<2x8x128x16x1xf16>, tensor<2x8x128x16x1xf16>) -> tensor<8x16x1x3x3x1xf32>
  return %0 : tensor<8x16x1x3x3x1xf32>
}

// -----

func.func @rows_split_with_a_chunk(%x: tensor<2x8x128x16x1xf16>, %dy: tensor<2x8x128x16x1xf16>) -> tensor<16x16x1x3x3x1xf32> {
  // expected-error@+1 {{split: a split over loops n,o0 takes chunk 1, got 2}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 16 : i64, k_batch = 16 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, split_chunk = 2 : i64, split_dim = "n,o0", strides = array<i64: 1, 1>} : (tensor<2x8x128x16x1xf16>, tensor<2x8x128x16x1xf16>) -> tensor<16x16x1x3x3x1xf32>
  return %0 : tensor<16x16x1x3x3x1xf32>
}
