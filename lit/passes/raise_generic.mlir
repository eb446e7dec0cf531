// RUN: %convbw-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(convbw-raise{remarks=true})'
// RUN: %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-raise)' | FileCheck %s

// Hand-written generics: a weight gradient in layout 2 (NHWGC/GKYXC/NHWGK) with dy as the first operand and
// a stride, one whose x is padded with a non-zero value (not folded: x is read padded), and near misses.

// CHECK-LABEL: func.func @layout2_dy_first
// CHECK-NOT: linalg.generic
// CHECK: "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x9x9x2x4xf32>, tensor<2x4x4x2x8xf32>) -> tensor<2x8x3x3x4xf32>
// CHECK-NOT: linalg.generic
// (g, k, y, x, c | n, ho, wo)
func.func @layout2_dy_first(%x: tensor<2x9x9x2x4xf32>, %dy: tensor<2x4x4x2x8xf32>) -> tensor<2x8x3x3x4xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x8x3x3x4xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<2x8x3x3x4xf32>) -> tensor<2x8x3x3x4xf32>
  %dw = linalg.generic {indexing_maps = [
      affine_map<(g, k, y, x, c, n, ho, wo) -> (n, ho, wo, g, k)>,
      affine_map<(g, k, y, x, c, n, ho, wo) -> (n, ho * 2 + y, wo * 2 + x, g, c)>,
      affine_map<(g, k, y, x, c, n, ho, wo) -> (g, k, y, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%dy, %x : tensor<2x4x4x2x8xf32>, tensor<2x9x9x2x4xf32>) outs(%acc : tensor<2x8x3x3x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %b, %a : f32
    %s = arith.addf %o, %p : f32
    linalg.yield %s : f32
  } -> tensor<2x8x3x3x4xf32>
  return %dw : tensor<2x8x3x3x4xf32>
}

// -----

// CHECK-LABEL: func.func @pad_of_one
// CHECK: %[[P:.*]] = tensor.pad
// CHECK: "convbw.conv_bwd_weight"(%[[P]], %arg1) {{.*}}layout = "NHWC/KYXC/NHWK", pad_high = array<i64: 0>, pad_low = array<i64: 0>{{.*}} : (tensor<1x6x3xf16>, tensor<1x4x5xf16>) -> tensor<5x3x3xf32>
func.func @pad_of_one(%x: tensor<1x4x3xf16>, %dy: tensor<1x4x5xf16>) -> tensor<5x3x3xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f16
  %xp = tensor.pad %x low[0, 1, 0] high[0, 1, 0] {
  ^bb0(%i: index, %j: index, %k: index):
    tensor.yield %one : f16
  } : tensor<1x4x3xf16> to tensor<1x6x3xf16>
  %e = tensor.empty() : tensor<5x3x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<5x3x3xf32>) -> tensor<5x3x3xf32>
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, x, c, n, w) -> (n, w + x, c)>,
      affine_map<(k, x, c, n, w) -> (n, w, k)>,
      affine_map<(k, x, c, n, w) -> (k, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%xp, %dy : tensor<1x6x3xf16>, tensor<1x4x5xf16>) outs(%acc : tensor<5x3x3xf32>) {
  ^bb0(%a: f16, %b: f16, %o: f32):
    %a32 = arith.extf %a : f16 to f32
    %b32 = arith.extf %b : f16 to f32
    %p = arith.mulf %a32, %b32 : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3xf32>
  return %dw : tensor<5x3x3xf32>
}

// -----

// A forward convolution, y[n, k, ho, wo] = sum x[n, c, ho + y, wo + x] * w[k, c, y, x]: left alone.
// CHECK-LABEL: func.func @forward_conv
// CHECK-NOT: convbw.conv_bwd_weight
func.func @forward_conv(%x: tensor<2x4x8x8xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<2x6x6x6xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x6x6x6xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<2x6x6x6xf32>) -> tensor<2x6x6x6xf32>
  // expected-remark @+1 {{not raised: x/dW/dy read as CNHW/CKYX/KNHW, not a weight-gradient layout}}
  %y = linalg.generic {indexing_maps = [
      affine_map<(n, k, ho, wo, c, y, x) -> (n, c, ho + y, wo + x)>,
      affine_map<(n, k, ho, wo, c, y, x) -> (k, c, y, x)>,
      affine_map<(n, k, ho, wo, c, y, x) -> (n, k, ho, wo)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%x, %w : tensor<2x4x8x8xf32>, tensor<6x4x3x3xf32>) outs(%acc : tensor<2x6x6x6xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<2x6x6x6xf32>
  return %y : tensor<2x6x6x6xf32>
}

// -----

// A matmul has no window.
// CHECK-LABEL: func.func @matmul
// CHECK-NOT: convbw.conv_bwd_weight
func.func @matmul(%a: tensor<4x8xf32>, %b: tensor<8x5xf32>) -> tensor<4x5xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x5xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<4x5xf32>) -> tensor<4x5xf32>
  // expected-remark @+1 {{not raised: no input reads a sliding window (a plain contraction)}}
  %c = linalg.generic {indexing_maps = [affine_map<(i, j, r) -> (i, r)>, affine_map<(i, j, r) -> (r, j)>,
                                        affine_map<(i, j, r) -> (i, j)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : tensor<4x8xf32>, tensor<8x5xf32>) outs(%acc : tensor<4x5xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<4x5xf32>
  return %c : tensor<4x5xf32>
}

// -----

// A weight gradient accumulated onto the caller's tensor, and a max-pool-like window: left alone.
// CHECK-LABEL: func.func @not_zero_filled
// CHECK-NOT: convbw.conv_bwd_weight
func.func @not_zero_filled(%x: tensor<1x6x3xf32>, %dy: tensor<1x4x5xf32>, %d: tensor<5x3x3xf32>) -> (tensor<5x3x3xf32>, tensor<5x3x3xf32>) {
  // expected-remark @+1 {{not raised: accumulates onto a tensor that is not zero-filled}}
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, x, c, n, w) -> (n, w + x, c)>,
      affine_map<(k, x, c, n, w) -> (n, w, k)>,
      affine_map<(k, x, c, n, w) -> (k, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%x, %dy : tensor<1x6x3xf32>, tensor<1x4x5xf32>) outs(%d : tensor<5x3x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3xf32>
  // expected-remark @+1 {{not raised: the body is not a multiply-accumulate (arith.mulf, arith.maximumf, linalg.yield)}}
  %m = linalg.generic {indexing_maps = [
      affine_map<(k, x, c, n, w) -> (n, w + x, c)>,
      affine_map<(k, x, c, n, w) -> (n, w, k)>,
      affine_map<(k, x, c, n, w) -> (k, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%x, %dy : tensor<1x6x3xf32>, tensor<1x4x5xf32>) outs(%d : tensor<5x3x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.maximumf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3xf32>
  return %dw, %m : tensor<5x3x3xf32>, tensor<5x3x3xf32>
}

// -----

// x and dy transposed from channels-last to NCHW before a generic writing dW as KYXC: as written the
// operands read NCHW/KYXC/NKHW, no layout of ours; read through the transposes, NHWC/KYXC/NHWK.
// CHECK-LABEL: func.func @through_transposes
// CHECK-NOT: linalg.generic
// CHECK: "convbw.conv_bwd_weight"(%arg0, %arg1) {{.*}}layout = "NHWC/KYXC/NHWK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x6x6x3xf32>, tensor<1x4x4x5xf32>) -> tensor<5x3x3x3xf32>
// CHECK-NOT: linalg.generic
func.func @through_transposes(%x: tensor<1x6x6x3xf32>, %dy: tensor<1x4x4x5xf32>) -> tensor<5x3x3x3xf32> {
  %zero = arith.constant 0.0 : f32
  %xe = tensor.empty() : tensor<1x3x6x6xf32>
  %xt = linalg.transpose ins(%x : tensor<1x6x6x3xf32>) outs(%xe : tensor<1x3x6x6xf32>) permutation = [0, 3, 1, 2]
  %de = tensor.empty() : tensor<1x5x4x4xf32>
  %dt = linalg.transpose ins(%dy : tensor<1x4x4x5xf32>) outs(%de : tensor<1x5x4x4xf32>) permutation = [0, 3, 1, 2]
  %e = tensor.empty() : tensor<5x3x3x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<5x3x3x3xf32>) -> tensor<5x3x3x3xf32>
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, y, x, c, n, h, w) -> (n, c, h + y, w + x)>,
      affine_map<(k, y, x, c, n, h, w) -> (n, k, h, w)>,
      affine_map<(k, y, x, c, n, h, w) -> (k, y, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%xt, %dt : tensor<1x3x6x6xf32>, tensor<1x5x4x4xf32>) outs(%acc : tensor<5x3x3x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3x3xf32>
  return %dw : tensor<5x3x3x3xf32>
}

// -----

// Only x transposed, to the NCHW the rest reads: folding it would mix layouts, so the transpose stays.
// CHECK-LABEL: func.func @transpose_kept
// CHECK: %[[XT:.*]] = linalg.transpose
// CHECK: "convbw.conv_bwd_weight"(%[[XT]], %arg1) {{.*}}layout = "NCHW/KCYX/NKHW"{{.*}} : (tensor<1x3x6x6xf32>, tensor<1x5x4x4xf32>) -> tensor<5x3x3x3xf32>
func.func @transpose_kept(%x: tensor<1x6x6x3xf32>, %dy: tensor<1x5x4x4xf32>) -> tensor<5x3x3x3xf32> {
  %zero = arith.constant 0.0 : f32
  %xe = tensor.empty() : tensor<1x3x6x6xf32>
  %xt = linalg.transpose ins(%x : tensor<1x6x6x3xf32>) outs(%xe : tensor<1x3x6x6xf32>) permutation = [0, 3, 1, 2]
  %e = tensor.empty() : tensor<5x3x3x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<5x3x3x3xf32>) -> tensor<5x3x3x3xf32>
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, c, y, x, n, h, w) -> (n, c, h + y, w + x)>,
      affine_map<(k, c, y, x, n, h, w) -> (n, k, h, w)>,
      affine_map<(k, c, y, x, n, h, w) -> (k, c, y, x)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%xt, %dy : tensor<1x3x6x6xf32>, tensor<1x5x4x4xf32>) outs(%acc : tensor<5x3x3x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3x3xf32>
  return %dw : tensor<5x3x3x3xf32>
}

// -----

// A pad whose value is computed in its region is not a zero pad: x is read padded, the op's pads are 0.
// CHECK-LABEL: func.func @computed_pad_value
// CHECK: %[[P:.*]] = tensor.pad
// CHECK: "convbw.conv_bwd_weight"(%[[P]], %arg1) {{.*}}pad_high = array<i64: 0>, pad_low = array<i64: 0>{{.*}} : (tensor<1x6x3xf32>, tensor<1x4x5xf32>)
func.func @computed_pad_value(%x: tensor<1x4x3xf32>, %dy: tensor<1x4x5xf32>, %v: f32) -> tensor<5x3x3xf32> {
  %zero = arith.constant 0.0 : f32
  %xp = tensor.pad %x low[0, 1, 0] high[0, 1, 0] {
  ^bb0(%i: index, %j: index, %k: index):
    %w = arith.mulf %zero, %v : f32
    tensor.yield %w : f32
  } : tensor<1x4x3xf32> to tensor<1x6x3xf32>
  %e = tensor.empty() : tensor<5x3x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<5x3x3xf32>) -> tensor<5x3x3xf32>
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, x, c, n, w) -> (n, w + x, c)>,
      affine_map<(k, x, c, n, w) -> (n, w, k)>,
      affine_map<(k, x, c, n, w) -> (k, x, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%xp, %dy : tensor<1x6x3xf32>, tensor<1x4x5xf32>) outs(%acc : tensor<5x3x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<5x3x3xf32>
  return %dw : tensor<5x3x3xf32>
}

// -----

// One tap loop in both window dimensions (a diagonal filter) is no convolution of ours.
// CHECK-LABEL: func.func @diagonal_taps
// CHECK-NOT: convbw.conv_bwd_weight
func.func @diagonal_taps(%x: tensor<1x2x6x6xf32>, %dy: tensor<1x3x4x4xf32>) -> tensor<3x2x3xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x2x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<3x2x3xf32>) -> tensor<3x2x3xf32>
  // expected-remark @+1 {{not raised: a filter tap or output position loop indexes two window dimensions of x}}
  %dw = linalg.generic {indexing_maps = [
      affine_map<(k, c, t, n, h, w) -> (n, c, h + t, w + t)>,
      affine_map<(k, c, t, n, h, w) -> (n, k, h, w)>,
      affine_map<(k, c, t, n, h, w) -> (k, c, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%x, %dy : tensor<1x2x6x6xf32>, tensor<1x3x4x4xf32>) outs(%acc : tensor<3x2x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %p, %o : f32
    linalg.yield %s : f32
  } -> tensor<3x2x3xf32>
  return %dw : tensor<3x2x3xf32>
}

// -----

// A weight gradient written as a named forward convolution of transposed x and dy (N and C swapped, the
// stride 2 as the convolution's dilation), its result transposed from CKYX to KCYX: matched through the op's
// generalization, all three transposes folded.
// CHECK-LABEL: func.func @named_conv_between_transposes
// CHECK-NOT: linalg.conv_2d_nchw_fchw
// CHECK-NOT: linalg.transpose
// CHECK: %[[DW:.*]] = "convbw.conv_bwd_weight"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NCHW/KCYX/NKHW", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x4x9x9xf32>, tensor<2x6x4x4xf32>) -> tensor<6x4x3x3xf32>
// CHECK-NOT: linalg.transpose
// CHECK: return %[[DW]]
func.func @named_conv_between_transposes(%x: tensor<2x4x9x9xf32>, %dy: tensor<2x6x4x4xf32>) -> tensor<6x4x3x3xf32> {
  %zero = arith.constant 0.0 : f32
  %xe = tensor.empty() : tensor<4x2x9x9xf32>
  %xt = linalg.transpose ins(%x : tensor<2x4x9x9xf32>) outs(%xe : tensor<4x2x9x9xf32>) permutation = [1, 0, 2, 3]
  %de = tensor.empty() : tensor<6x2x4x4xf32>
  %dt = linalg.transpose ins(%dy : tensor<2x6x4x4xf32>) outs(%de : tensor<6x2x4x4xf32>) permutation = [1, 0, 2, 3]
  %e = tensor.empty() : tensor<4x6x3x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<4x6x3x3xf32>) -> tensor<4x6x3x3xf32>
  %ckyx = linalg.conv_2d_nchw_fchw {dilations = dense<2> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%xt, %dt : tensor<4x2x9x9xf32>, tensor<6x2x4x4xf32>) outs(%acc : tensor<4x6x3x3xf32>) -> tensor<4x6x3x3xf32>
  %we = tensor.empty() : tensor<6x4x3x3xf32>
  %dw = linalg.transpose ins(%ckyx : tensor<4x6x3x3xf32>) outs(%we : tensor<6x4x3x3xf32>) permutation = [1, 0, 2, 3]
  return %dw : tensor<6x4x3x3xf32>
}

// -----

// A named forward convolution is left alone, with the reason.
// CHECK-LABEL: func.func @named_forward_conv
// CHECK: linalg.conv_2d_nhwc_hwcf
func.func @named_forward_conv(%x: tensor<1x8x8x4xf32>, %w: tensor<3x3x4x6xf32>) -> tensor<1x6x6x6xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x6x6x6xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<1x6x6x6xf32>) -> tensor<1x6x6x6xf32>
  // expected-remark @+1 {{not raised: x/dW/dy read as CHWN/CYXK/HWNK, not a weight-gradient layout}}
  %y = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%x, %w : tensor<1x8x8x4xf32>, tensor<3x3x4x6xf32>) outs(%acc : tensor<1x6x6x6xf32>) -> tensor<1x6x6x6xf32>
  return %y : tensor<1x6x6x6xf32>
}
