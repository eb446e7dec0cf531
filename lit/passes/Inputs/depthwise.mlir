module {
  func.func @conv_bwd_weight(%arg0: tensor<2x8x128x16x1xf16>, %arg1: tensor<2x8x128x16x1xf16>) -> tensor<16x1x3x3x1xf16> {
    %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 16 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x8x128x16x1xf16>, tensor<2x8x128x16x1xf16>) -> tensor<16x1x3x3x1xf16>
    return %0 : tensor<16x1x3x3x1xf16>
  }
}

