// RUN: %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-lower-to-linalg)' | FileCheck %s
// RUN: %convbw-opt %s --split-input-file --pass-pipeline='builtin.module(convbw-lower-to-linalg{frontend-form=true})' | FileCheck %s --check-prefix=FRONTEND

// Grouped NHWGC, stride 2 x 1, dilation 1 x 2, asymmetric pads: one pad, x read at o*s + f*d through the
// map, dy second, an f32 accumulator [g, k, y, x, c], then one truncf to f16. No transposes.
// The pad is an elementwise generic reading x through tensor.extract: H (low 1) shifted by one and
// range-checked with one unsigned compare per padded dimension, W (high 2 only) range-checked; N, G, C
// read as they are; out-of-range positions read element 0 and yield zero.
// CHECK-DAG: #[[X:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6 * 2 + d2, d7 + d3 * 2, d0, d4)>
// CHECK-DAG: #[[DY:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d0, d1)>
// CHECK-DAG: #[[DW:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
// CHECK-LABEL: func.func @grouped_strided_dilated
// CHECK-NOT:   tensor.pad
// CHECK:       %[[PAD:.+]] = linalg.generic {{.*}} outs(%{{.+}} : tensor<2x8x11x2x3xf16>)
// CHECK:         %[[N:.+]] = linalg.index 0
// CHECK:         %[[H:.+]] = linalg.index 1
// CHECK:         %[[HS:.+]] = arith.subi %[[H]], %c1
// CHECK:         %[[HOK:.+]] = arith.cmpi ult, %[[HS]], %c7
// CHECK:         %[[W:.+]] = linalg.index 2
// CHECK:         %[[WOK:.+]] = arith.cmpi ult, %[[W]], %c9
// CHECK:         %[[OK:.+]] = arith.andi %[[HOK]], %[[WOK]]
// CHECK:         %[[G:.+]] = linalg.index 3
// CHECK:         %[[C:.+]] = linalg.index 4
// CHECK:         %[[HSAFE:.+]] = arith.select %[[OK]], %[[HS]], %c0
// CHECK:         %[[WSAFE:.+]] = arith.select %[[OK]], %[[W]], %c0
// CHECK:         %[[V:.+]] = tensor.extract %arg0[%[[N]], %[[HSAFE]], %[[WSAFE]], %[[G]], %[[C]]]
// CHECK:         arith.select %[[OK]], %[[V]], %cst
// CHECK:       } -> tensor<2x8x11x2x3xf16>
// CHECK:       %[[ACC:.+]] = linalg.generic {indexing_maps = [#[[X]], #[[DY]], #[[DW]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
// CHECK-SAME:    ins(%[[PAD]], %arg1 : tensor<2x8x11x2x3xf16>, tensor<2x3x7x2x5xf16>)
// CHECK:         arith.extf
// CHECK:         arith.extf
// CHECK:         arith.mulf
// CHECK:         arith.addf
// CHECK:       } -> tensor<2x5x3x3x3xf32>
// CHECK:       arith.truncf {{.*}} : f32 to f16
// CHECK-NOT:   linalg.transpose
// CHECK:       return
// FRONTEND-LABEL: func.func @grouped_strided_dilated
// FRONTEND:       tensor.pad %arg0 low[0, 1, 0, 0, 0] high[0, 0, 2, 0, 0]
// FRONTEND:       } : tensor<2x7x9x2x3xf16> to tensor<2x8x11x2x3xf16>
// FRONTEND-NOT:   tensor.extract
func.func @grouped_strided_dilated(%x: tensor<2x7x9x2x3xf16>, %dy: tensor<2x3x7x2x5xf16>) -> tensor<2x5x3x3x3xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 2>, groups = 2 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 2>, pad_low = array<i64: 1, 0>, strides = array<i64: 2, 1>} : (tensor<2x7x9x2x3xf16>, tensor<2x3x7x2x5xf16>) -> tensor<2x5x3x3x3xf16>
  return %0 : tensor<2x5x3x3x3xf16>
}

// -----

// PyTorch NCHW in f32, no pads: no tensor.pad, no extf/truncf; the accumulator is [k, x, c] and one
// transpose produces KCX.
// CHECK-LABEL: func.func @torch_1d_f32
// CHECK-NOT:   tensor.pad
// CHECK:       %[[ACC:.+]] = linalg.generic
// CHECK-SAME:    ins(%arg0, %arg1 : tensor<2x8x6xf32>, tensor<2x4x4xf32>) outs(%{{.+}} : tensor<4x3x8xf32>)
// CHECK-NOT:     arith.extf
// CHECK:       } -> tensor<4x3x8xf32>
// CHECK:       %[[T:.+]] = linalg.transpose ins(%[[ACC]] : tensor<4x3x8xf32>) outs(%{{.+}} : tensor<4x8x3xf32>) permutation = [0, 2, 1]
// CHECK:       return %[[T]] : tensor<4x8x3xf32>
func.func @torch_1d_f32(%x: tensor<2x8x6xf32>, %dy: tensor<2x4x4xf32>) -> tensor<4x8x3xf32> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1>, groups = 1 : i64, layout = "NCHW/KCYX/NKHW", pad_high = array<i64: 0>, pad_low = array<i64: 0>, strides = array<i64: 1>} : (tensor<2x8x6xf32>, tensor<2x4x4xf32>) -> tensor<4x8x3xf32>
  return %0 : tensor<4x8x3xf32>
}

// -----

// ck layout 0 (GNCDHW / GKCZYX), bf16 in with an f32 dW: no truncf; transpose [g,k,z,y,x,c] -> GKCZYX.
// CHECK-LABEL: func.func @ck0_3d_bf16_f32
// CHECK:       } -> tensor<2x1x2x6x6x6xbf16>
// FRONTEND-LABEL: func.func @ck0_3d_bf16_f32
// FRONTEND:       tensor.pad %arg0 low[0, 0, 0, 1, 1, 1] high[0, 0, 0, 1, 1, 1]
// CHECK:       arith.extf %{{.+}} : bf16 to f32
// CHECK-NOT:   arith.truncf
// CHECK:       linalg.transpose ins(%{{.+}} : tensor<2x4x3x3x3x2xf32>) outs(%{{.+}} : tensor<2x4x2x3x3x3xf32>) permutation = [0, 1, 5, 2, 3, 4]
func.func @ck0_3d_bf16_f32(%x: tensor<2x1x2x4x4x4xbf16>, %dy: tensor<2x1x4x4x4x4xbf16>) -> tensor<2x4x2x3x3x3xf32> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1, 1>, groups = 2 : i64, layout = "GNCHW/GKCYX/GNKHW", pad_high = array<i64: 1, 1, 1>, pad_low = array<i64: 1, 1, 1>, strides = array<i64: 1, 1, 1>} : (tensor<2x1x2x4x4x4xbf16>, tensor<2x1x4x4x4x4xbf16>) -> tensor<2x4x2x3x3x3xf32>
  return %0 : tensor<2x4x2x3x3x3xf32>
}

// -----

// Ops outside convbw are left alone; several convbw ops in one function are all lowered.
// CHECK-LABEL: func.func @two_ops
// CHECK-NOT:   convbw.conv_bwd_weight
// CHECK-COUNT-2: arith.mulf
// CHECK:       arith.addf %{{.+}}, %{{.+}} : tensor<1x2x1x1x2xf16>
func.func @two_ops(%x: tensor<1x2x2x1x2xf16>, %dy: tensor<1x2x2x1x2xf16>) -> tensor<1x2x1x1x2xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x2x2x1x2xf16>, tensor<1x2x2x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  %1 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x2x2x1x2xf16>, tensor<1x2x2x1x2xf16>) -> tensor<1x2x1x1x2xf16>
  %2 = arith.addf %0, %1 : tensor<1x2x1x1x2xf16>
  return %2 : tensor<1x2x1x1x2xf16>
}

// -----

// G=1 in a grouped layout: the unit G of x and dy is collapsed away before the contraction, so its maps
// index no constant 0. IREE would fold it by rebuilding the generic, which drops compilation_info.
// CHECK-DAG: #[[X1:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d4, d1 + d5, d2 + d6, d3)>
// CHECK-DAG: #[[DY1:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d4, d5, d6, d0)>
// CHECK-LABEL: func.func @unit_group
// CHECK:       %[[XC:.+]] = tensor.collapse_shape %arg0 {{\[\[}}0], [1], [2], [3, 4]] : tensor<2x5x5x1x3xf16> into tensor<2x5x5x3xf16>
// CHECK:       %[[DYC:.+]] = tensor.collapse_shape %arg1 {{\[\[}}0], [1], [2], [3, 4]] : tensor<2x3x3x1x4xf16> into tensor<2x3x3x4xf16>
// CHECK:       linalg.generic {indexing_maps = [#[[X1]], #[[DY1]], #{{[a-z0-9_]+}}]
// CHECK-SAME:    ins(%[[XC]], %[[DYC]] : tensor<2x5x5x3xf16>, tensor<2x3x3x4xf16>)
func.func @unit_group(%x: tensor<2x5x5x1x3xf16>, %dy: tensor<2x3x3x1x4xf16>) -> tensor<1x4x3x3x3xf16> {
  %0 = "convbw.conv_bwd_weight"(%x, %dy) {dilations = array<i64: 1, 1>, groups = 1 : i64, layout = "NHWGC/GKYXC/NHWGK", pad_high = array<i64: 0, 0>, pad_low = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<2x5x5x1x3xf16>, tensor<2x3x3x1x4xf16>) -> tensor<1x4x3x3x3xf16>
  return %0 : tensor<1x4x3x3x3xf16>
}
