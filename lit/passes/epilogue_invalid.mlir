// RUN: %convbw-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(convbw-lower-to-linalg)'

// The op's verifier on epilogues: one error each, at the op.

func.func @d_wrong_shape(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>, %d: tensor<1x2x1x1x3xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{D: expected shape 1x2x1x1x2 for this problem, got 1x2x1x1x3}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy, %d) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.0 : f64, beta = 2.0 : f64, kind = "bilinear"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>, tensor<1x2x1x1x3xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @d_wrong_type(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>, %d: tensor<1x2x1x1x2xbf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{epilogue.d_dtype: bilinear takes D of dW's type or f32 (f16 or f32), got bf16}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy, %d) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.0 : f64, beta = 2.0 : f64, kind = "bilinear"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>, tensor<1x2x1x1x2xbf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @accumulate_other_type(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>, %d: tensor<1x2x1x1x2xf32>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{epilogue.d_dtype: accumulate takes D of the output's own type (f16), got f32}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy, %d) {dilations = array<i64: 1, 1>, epilogue = {alpha = 1.0 : f64, beta = 1.0 : f64, kind = "accumulate"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>, tensor<1x2x1x1x2xf32>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @alpha_not_finite(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{epilogue.alpha: must be finite, got inf}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, epilogue = {alpha = 0x7FF0000000000000 : f64, kind = "scale"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @missing_d(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{a bilinear epilogue takes 3 operands (x, dy, D), got 2}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.0 : f64, beta = 2.0 : f64, kind = "bilinear"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @d_without_epilogue(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>, %d: tensor<1x2x1x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{expected 2 operands (x, dy) without an epilogue, got 3}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy, %d) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>, tensor<1x2x1x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @unknown_kind(%x: tensor<1x4x4x1x2xf16>, %dy: tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  // expected-error@+1 {{epilogue.kind: unknown epilogue 'relu'; known: scale, bilinear, accumulate}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.0 : f64, kind = "relu"}, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x4x1x2xf16>, tensor<1x4x4x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  return %0 : tensor<1x2x1x1x2xf16>
}

// -----

func.func @epilogue_on_split_stage(%x: tensor<4x4x4x1x2xf16>, %dy: tensor<4x4x4x1x2xf16>) -> tensor<2x1x2x1x1x2xf32> {
  // expected-error@+1 {{a split op (k_batch = 2) yields partial sums: its epilogue belongs to stage 2}}
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.0 : f64, kind = "scale"}, groups = 1 : i64, k_batch = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, split_chunk = 2 : i64, split_dim = "n", strides = array<i64: 1, 1>} : (tensor<4x4x4x1x2xf16>, tensor<4x4x4x1x2xf16>) -> tensor<2x1x2x1x1x2xf32>
  return %0 : tensor<2x1x2x1x1x2xf32>
}
