// A plan written by hand (or by an earlier convbw-plan): convbw-plan keeps it, the passes carry it out.
module {
  func.func @conv_bwd_weight(%arg0: tensor<4x7x7x1x8xf16>, %arg1: tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16> {
    %0 = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>, plan = {gemm = false, strategy = "mma", target = "gfx942", split = {chunk = 2 : i64, dim = "n", k_batch = 2 : i64}, tile = {intrinsic = "MFMA_F32_16x16x16_F16", k = 32 : i64, m = 32 : i64, n = 16 : i64, stages = 3 : i64, subgroups_m = 2 : i64, subgroups_n = 1 : i64}}} : (tensor<4x7x7x1x8xf16>, tensor<4x7x7x1x36xf16>) -> tensor<1x36x3x3x8xf16>
    return %0 : tensor<1x36x3x3x8xf16>
  }
}
