module {
  func.func @conv_bwd_weight(%arg0: tensor<4x7x7x1x8xf16>, %arg1: tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16> {
    %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>} : (tensor<4x7x7x1x8xf16>, tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16>
    return %0 : tensor<1x36x3x3x8xf16>
  }
}
