// data_gradient_f32: bench/raise_inputs.py (torch 2.13.0+cpu)
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3, d4)>
#map1 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d5, d3 + d6, d4 + d7)>
#map2 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d1, d5, d2, d6, d7)>
#map3 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
module {
  util.func public @main$async(%arg0: !hal.buffer_view, %arg1: !hal.buffer_view, %arg2: !hal.buffer_view, %arg3: !hal.fence, %arg4: !hal.fence) -> !hal.buffer_view attributes {inlining_policy = #util.inline.never, iree.abi.model = "coarse-fences", iree.abi.stub} {
    %cst = arith.constant 0.000000e+00 : f32
    %c2 = arith.constant 2 : index
    %0 = hal.tensor.import wait(%arg3) => %arg1 : !hal.buffer_view -> tensor<2x12x8x8xf32>
    %1 = hal.tensor.import wait(%arg3) => %arg2 : !hal.buffer_view -> tensor<12x4x3x3xf32>
    %expanded = tensor.expand_shape %0 [[0], [1, 2], [3], [4]] output_shape [2, 2, 6, 8, 8] : tensor<2x12x8x8xf32> into tensor<2x2x6x8x8xf32>
    %expanded_0 = tensor.expand_shape %1 [[0, 1], [2], [3], [4]] output_shape [2, 6, 4, 3, 3] : tensor<12x4x3x3xf32> into tensor<2x6x4x3x3xf32>
    %2 = tensor.empty() : tensor<2x6x4x3x3xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<2x6x4x3x3xf32>) -> tensor<2x6x4x3x3xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]} ins(%expanded_0 : tensor<2x6x4x3x3xf32>) outs(%3 : tensor<2x6x4x3x3xf32>) {
    ^bb0(%in: f32, %out: f32):
      %10 = linalg.index 0 : index
      %11 = linalg.index 1 : index
      %12 = linalg.index 2 : index
      %13 = linalg.index 3 : index
      %14 = linalg.index 4 : index
      %15 = arith.subi %c2, %13 : index
      %16 = arith.subi %c2, %14 : index
      %extracted = tensor.extract %expanded_0[%10, %11, %12, %15, %16] : tensor<2x6x4x3x3xf32>
      linalg.yield %extracted : f32
    } -> tensor<2x6x4x3x3xf32>
    %padded = tensor.pad %expanded low[0, 0, 0, 1, 1] high[0, 0, 0, 1, 1] {
    ^bb0(%arg5: index, %arg6: index, %arg7: index, %arg8: index, %arg9: index):
      tensor.yield %cst : f32
    } : tensor<2x2x6x8x8xf32> to tensor<2x2x6x10x10xf32>
    %5 = tensor.empty() : tensor<2x2x4x8x8xf32>
    %6 = linalg.fill ins(%cst : f32) outs(%5 : tensor<2x2x4x8x8xf32>) -> tensor<2x2x4x8x8xf32>
    %7 = linalg.generic {indexing_maps = [#map1, #map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]} ins(%padded, %4 : tensor<2x2x6x10x10xf32>, tensor<2x6x4x3x3xf32>) outs(%6 : tensor<2x2x4x8x8xf32>) {
    ^bb0(%in: f32, %in_1: f32, %out: f32):
      %10 = arith.mulf %in, %in_1 : f32
      %11 = arith.addf %10, %out : f32
      linalg.yield %11 : f32
    } -> tensor<2x2x4x8x8xf32>
    %collapsed = tensor.collapse_shape %7 [[0], [1, 2], [3], [4]] : tensor<2x2x4x8x8xf32> into tensor<2x8x8x8xf32>
    %8 = hal.tensor.barrier join(%collapsed : tensor<2x8x8x8xf32>) => %arg4 : !hal.fence
    %9 = hal.tensor.export %8 : tensor<2x8x8x8xf32> -> !hal.buffer_view
    util.return %9 : !hal.buffer_view
  }
  util.func public @main(%arg0: !hal.buffer_view, %arg1: !hal.buffer_view, %arg2: !hal.buffer_view) -> !hal.buffer_view attributes {iree.abi.stub} {
    %0 = util.null : !hal.fence
    %c-1_i32 = arith.constant -1 : i32
    %c0 = arith.constant 0 : index
    %device_0 = hal.devices.get %c0 : !hal.device
    %fence = hal.fence.create device(%device_0 : !hal.device) flags("None") : !hal.fence
    %1 = util.call @main$async(%arg0, %arg1, %arg2, %0, %fence) : (!hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.fence, !hal.fence) -> !hal.buffer_view
    %status = hal.fence.await until([%fence]) timeout_millis(%c-1_i32) flags("None") : i32
    util.return %1 : !hal.buffer_view
  }
}
