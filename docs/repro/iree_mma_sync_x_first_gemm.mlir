// IREE 3.13, CUDA: wrong result (docs/decisions.md#iree-1x1-wrong). out[m, n] = sum_r a[r, n] * b[r, m]:
// operand 0 supplies the result's inner dimension. Measured wrong on an H200 (sm_80 and sm_90a code),
// right with the operands swapped (ins(%b, %a), maps (r, m) and (r, n)) and right on the host.
// iree-compile repro.mlir --iree-hal-target-device=cuda --iree-cuda-target=sm_80 -o repro.vmfb
// iree-run-module --device=cuda --module=repro.vmfb --function=gemm --input=@a.npy --input=@b.npy
!a = tensor<6272x16xf16>
!b = tensor<6272x16xf16>
func.func @gemm(%a: !a, %b: !b) -> tensor<16x16xf16> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<16x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<16x16xf32>) -> tensor<16x16xf32>
  %sum = linalg.generic {
      indexing_maps = [affine_map<(m, n, r) -> (r, n)>, affine_map<(m, n, r) -> (r, m)>,
                       affine_map<(m, n, r) -> (m, n)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : !a, !b) outs(%acc : tensor<16x16xf32>) {
  ^bb0(%x: f16, %y: f16, %o: f32):
    %xf = arith.extf %x : f16 to f32
    %yf = arith.extf %y : f16 to f32
    %p = arith.mulf %xf, %yf : f32
    %s = arith.addf %o, %p : f32
    linalg.yield %s : f32
  } -> tensor<16x16xf32>
  %out_empty = tensor.empty() : tensor<16x16xf16>
  %out = linalg.generic {
      indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%sum : tensor<16x16xf32>) outs(%out_empty : tensor<16x16xf16>) {
  ^bb0(%v: f32, %o: f16):
    %t = arith.truncf %v : f32 to f16
    linalg.yield %t : f16
  } -> tensor<16x16xf16>
  return %out : tensor<16x16xf16>
}
