func.func @conv(%x: tensor<2x6x6x1x8xf16>, %dy: tensor<2x6x6x1x4xf16>) -> tensor<1x4x3x3x8xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x6x6x1x8xf16>, tensor<2x6x6x1x4xf16>) -> tensor<1x4x3x3x8xf16>
  return %0 : tensor<1x4x3x3x8xf16>
}
