// A malformed plan attribute makes the op invalid, reported at the op.
// RUN: %convbw-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(convbw-split-k)'

func.func @unknown_strategy(%x: tensor<4x7x7x1x8xf16>, %dy: tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16> {
  // expected-error @+1 {{'convbw.conv_bwd_weight' op plan.strategy: expected one of mma, simt, iree, explicit, got 'fast'}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>, plan = {gemm = false, strategy = "fast", target = "host"}} : (tensor<4x7x7x1x8xf16>, tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16>
  return %0 : tensor<1x36x3x3x8xf16>
}

// -----

func.func @unknown_entry(%x: tensor<4x7x7x1x8xf16>, %dy: tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16> {
  // expected-error @+1 {{'convbw.conv_bwd_weight' op plan: unknown entries speed; known:}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>, plan = {gemm = false, speed = 3 : i64, strategy = "iree", target = "host"}} : (tensor<4x7x7x1x8xf16>, tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16>
  return %0 : tensor<1x36x3x3x8xf16>
}

// -----

func.func @split_that_does_not_fit(%x: tensor<4x7x7x1x8xf16>, %dy: tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16> {
  // expected-error @+1 {{convbw-split-k: the plan's split does not fit this op: split: k_batch 8 x chunk 1 must cover loop 'n' of extent 4 with no empty chunk}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>, plan = {gemm = false, split = {chunk = 1 : i64, dim = "n", k_batch = 8 : i64}, strategy = "iree", target = "host"}} : (tensor<4x7x7x1x8xf16>, tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16>
  return %0 : tensor<1x36x3x3x8xf16>
}
