// RUN: %convbw-opt %s | FileCheck %s --check-prefix=ROUND
// RUN: %convbw-opt %s --pass-pipeline='builtin.module(convbw-plan,convbw-split-k,convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s --check-prefix=UNSPLIT
// RUN: %convbw-opt %s --pass-pipeline='builtin.module(convbw-plan{k-batch=2},convbw-split-k)' | FileCheck %s --check-prefix=SPLIT
// RUN: %convbw-opt --ck "2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1" --scale 0.5 --convbw-pipeline=host | FileCheck %s --check-prefix=SCALE
// RUN: %convbw-opt --ck "2 2 4 8 16 3 3 7 7 1 1 1 1 1 1 1 1" --accumulate | FileCheck %s --check-prefix=ACCUM
// RUN: %convbw-opt --ck "2 1 4 8 16 1 1 7 7 1 1 1 1 0 0 0 0" --alpha 2 --beta 2 --convbw-pipeline=host | FileCheck %s --check-prefix=GEMM

// The bilinear epilogue dW = 2 * (x * dy) + 0.5 * D (CK's Bilinear), D f32 in dW's layout (GKCYX),
// dW f16. It prints and parses: the attribute and the third operand survive a round trip.
// ROUND: "convbw.conv_bwd_weight"(%arg0, %arg1, %arg2)
// ROUND-SAME: epilogue = {alpha = 2.000000e+00 : f64, beta = 5.000000e-01 : f64, kind = "bilinear"}
// ROUND-SAME: tensor<2x8x16x3x3xf32>) -> tensor<2x8x16x3x3xf16>

// Unsplit: the epilogue is the generic that turns the f32 accumulator into dW: alpha, beta, D, the
// conversion and the transpose to GKCYX in one elementwise op (no linalg.transpose, no separate pass
// over dW); IREE fuses it into the contraction's dispatch (epilogue_dispatch.mlir).
// UNSPLIT: %[[PROD:.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]
// UNSPLIT-SAME: outs(%{{.+}} : tensor<2x8x3x3x16xf32>) attrs = {convbw.contraction
// UNSPLIT-NOT: epilogue
// UNSPLIT: linalg.generic {{.*}} ins(%[[PROD]], %arg2 : tensor<2x8x3x3x16xf32>, tensor<2x8x16x3x3xf32>) outs(%{{.+}} : tensor<2x8x16x3x3xf16>)
// UNSPLIT: arith.mulf %in, %[[ALPHA:.+]] : f32
// UNSPLIT: arith.mulf %in_{{.+}}, %[[BETA:.+]] : f32
// UNSPLIT: arith.addf
// UNSPLIT: arith.truncf
// UNSPLIT-NOT: linalg.transpose
// UNSPLIT-NOT: linalg.generic

// Split: stage 1 (the partial sums) carries no epilogue and no D, so it is never applied once per
// split; stage 2 reduces in f32 and applies it where it converts.
// SPLIT: "convbw.conv_bwd_weight"(%arg0, %arg1) {
// SPLIT-NOT: epilogue
// SPLIT-SAME: k_batch = 2
// SPLIT: %[[SUM:.+]] = linalg.generic {{.*}} "reduction"]} ins(%0 : tensor<2x2x8x3x3x16xf32>)
// SPLIT: linalg.generic {{.*}} ins(%[[SUM]], %arg2 : tensor<2x8x3x3x16xf32>, tensor<2x8x16x3x3xf32>)
// SPLIT: arith.constant 2.000000e+00 : f32
// SPLIT: arith.constant 5.000000e-01 : f32
// SPLIT: arith.truncf

// Scale: no D operand, one multiply in the converting generic.
// SCALE: func.func @conv_bwd_weight(%arg0: tensor<4x7x7x2x16xf16>, %arg1: tensor<4x7x7x2x8xf16>) -> tensor<2x8x3x3x16xf16>
// SCALE: convbw.contraction
// SCALE: linalg.generic {{.*}} ins(%{{.+}} : tensor<2x8x3x3x16xf32>) outs(%{{.+}} : tensor<2x8x3x3x16xf16>)
// SCALE: arith.mulf %in, %{{.+}} : f32
// SCALE-NEXT: arith.truncf

// Accumulate: D is the output's own storage, tied to the result for IREE.
// ACCUM: func.func @conv_bwd_weight(%arg0: tensor<4x7x7x2x16xf16>, %arg1: tensor<4x7x7x2x8xf16>, %arg2: tensor<2x8x3x3x16xf16> {iree.abi.output = 0 : index}) -> tensor<2x8x3x3x16xf16>
// ACCUM: epilogue = {alpha = 1.000000e+00 : f64, beta = 1.000000e+00 : f64, kind = "accumulate"}

// A 1x1 becomes a GEMM (convbw-explicit-gemm): D is collapsed like dW and read by the GEMM's write.
// GEMM: %[[D:.+]] = tensor.collapse_shape %arg2 {{\[\[}}0], [1], [2, 3], [4]] : tensor<1x8x1x1x16xf16> into tensor<1x8x1x16xf16>
// GEMM: convbw.contraction
// GEMM: linalg.generic {{.*}} ins(%{{.+}}, %[[D]] : tensor<1x8x1x16xf32>, tensor<1x8x1x16xf16>)
// GEMM: arith.addf
// GEMM: arith.truncf
// GEMM: tensor.expand_shape

module {
  func.func @conv_bwd_weight(%arg0: tensor<2x4x16x7x7xf16>, %arg1: tensor<2x4x8x7x7xf16>, %arg2: tensor<2x8x16x3x3xf32>) -> tensor<2x8x16x3x3xf16> {
    %0 = "convbw.conv_bwd_weight"(%arg0, %arg1, %arg2) {dilations = array<i64: 1, 1>, epilogue = {alpha = 2.000000e+00 : f64, beta = 5.000000e-01 : f64, kind = "bilinear"}, groups = 2 : i64, layout = "GNCHW/GKCYX/GNKHW", pad_high = array<i64: 1, 1>, pad_low = array<i64: 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x4x16x7x7xf16>, tensor<2x4x8x7x7xf16>, tensor<2x8x16x3x3xf32>) -> tensor<2x8x16x3x3xf16>
    return %0 : tensor<2x8x16x3x3xf16>
  }
}
