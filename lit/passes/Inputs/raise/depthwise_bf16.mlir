// depthwise_bf16: bench/raise_inputs.py (torch 2.13.0+cpu)
#map = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d0, d2, d3 + d6, d4 + d7)>
#map1 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d0, d1, d6, d7)>
#map2 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
#map3 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3, d4)>
module {
  util.func public @main$async(%arg0: !hal.buffer_view, %arg1: !hal.buffer_view, %arg2: !hal.buffer_view, %arg3: !hal.fence, %arg4: !hal.fence) -> !hal.buffer_view attributes {inlining_policy = #util.inline.never, iree.abi.model = "coarse-fences", iree.abi.stub} {
    %cst = arith.constant 0.000000e+00 : bf16
    %cst_0 = arith.constant 0.000000e+00 : f32
    %0 = hal.tensor.import wait(%arg3) => %arg0 : !hal.buffer_view -> tensor<2x4x8x8xbf16>
    %1 = hal.tensor.import wait(%arg3) => %arg1 : !hal.buffer_view -> tensor<2x4x8x8xbf16>
    %expanded = tensor.expand_shape %1 [[0], [1, 2], [3], [4]] output_shape [2, 4, 1, 8, 8] : tensor<2x4x8x8xbf16> into tensor<2x4x1x8x8xbf16>
    %expanded_1 = tensor.expand_shape %0 [[0], [1, 2], [3], [4]] output_shape [2, 4, 1, 8, 8] : tensor<2x4x8x8xbf16> into tensor<2x4x1x8x8xbf16>
    %padded = tensor.pad %expanded_1 low[0, 0, 0, 1, 1] high[0, 0, 0, 1, 1] {
    ^bb0(%arg5: index, %arg6: index, %arg7: index, %arg8: index, %arg9: index):
      tensor.yield %cst : bf16
    } : tensor<2x4x1x8x8xbf16> to tensor<2x4x1x10x10xbf16>
    %2 = tensor.empty() : tensor<4x1x1x3x3xf32>
    %3 = linalg.fill ins(%cst_0 : f32) outs(%2 : tensor<4x1x1x3x3xf32>) -> tensor<4x1x1x3x3xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]} ins(%padded, %expanded : tensor<2x4x1x10x10xbf16>, tensor<2x4x1x8x8xbf16>) outs(%3 : tensor<4x1x1x3x3xf32>) {
    ^bb0(%in: bf16, %in_2: bf16, %out: f32):
      %9 = arith.extf %in : bf16 to f32
      %10 = arith.extf %in_2 : bf16 to f32
      %11 = arith.mulf %9, %10 : f32
      %12 = arith.addf %11, %out : f32
      linalg.yield %12 : f32
    } -> tensor<4x1x1x3x3xf32>
    %5 = tensor.empty() : tensor<4x1x1x3x3xbf16>
    %6 = linalg.generic {indexing_maps = [#map3, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]} ins(%4 : tensor<4x1x1x3x3xf32>) outs(%5 : tensor<4x1x1x3x3xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %9 = arith.truncf %in : f32 to bf16
      linalg.yield %9 : bf16
    } -> tensor<4x1x1x3x3xbf16>
    %collapsed = tensor.collapse_shape %6 [[0, 1], [2], [3], [4]] : tensor<4x1x1x3x3xbf16> into tensor<4x1x3x3xbf16>
    %7 = hal.tensor.barrier join(%collapsed : tensor<4x1x3x3xbf16>) => %arg4 : !hal.fence
    %8 = hal.tensor.export %7 : tensor<4x1x3x3xbf16> -> !hal.buffer_view
    util.return %8 : !hal.buffer_view
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
