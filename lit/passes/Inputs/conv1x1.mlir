module {
  func.func @conv_bwd_weight(%arg0: tensor<4x6x6x2x16xf16>, %arg1: tensor<4x6x6x2x8xf16>) -> tensor<2x8x1x1x16xf16> {
    %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x6x6x2x16xf16>, tensor<4x6x6x2x8xf16>) -> tensor<2x8x1x1x16xf16>
    return %0 : tensor<2x8x1x1x16xf16>
  }
}
