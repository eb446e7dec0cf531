# The sm_90a GEMM with fp8 operands (convbw_mlir/kernels/gemm_sm90.py, issue 24 item 4) on a tiny problem:
# e4m3 A, e5m2 B, both K-major; wgmma m64nNk32 on descriptors (4 a 128-element swizzled row), the scales
# binding read once and applied in the epilogue, bf16 out; and the PTX IREE 3.13 makes of it.
# RUN: %PYTHON %s | FileCheck %s
import tempfile
from pathlib import Path

from convbw_mlir.build.iree import compile_module
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, gemm_module

with new_context(), ir.Location.unknown():
    module = gemm_module(128, 64, 256, Sm90Tiling(bn=64, stages=2, elem_bytes=1), "f8E4M3FN", "bf16", "f8E5M2")
    assert module.operation.verify()
    text = str(module)
print("TEST: ir")
print(text)
# CHECK-LABEL: TEST: ir
# CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global
# CHECK: } else {
# CHECK-NEXT: nvvm.setmaxregister increase 232
# CHECK: memref.load {{.*}} : memref<2xf32>
# CHECK: memref.load {{.*}} : memref<2xf32>
# CHECK: arith.mulf
# CHECK: nvvm.wgmma.fence.aligned
# CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 64, k = 32>, D[<f32>, <one>], A[<e4m3>, {{.*}}, B[<e5m2>
# CHECK: nvvm.wgmma.commit.group.sync.aligned
# CHECK: vector.broadcast
# CHECK: arith.mulf {{.*}} : vector<2xf32>
# CHECK: arith.truncf {{.*}} : vector<2xf32> to vector<2xbf16>
# CHECK: func.func @main({{.*}}xf8E4M3FN>, {{.*}}xf8E5M2>, {{.*}}tensor<2xf32>) -> tensor<128x64xbf16>

with tempfile.TemporaryDirectory() as tmp:
    compile_module(text, "sm_90a", [f"--iree-hal-dump-executable-binaries-to={tmp}"])
    (ptx,) = Path(tmp).glob("*.ptx")
    print("TEST: ptx")
    print(ptx.read_text())
# CHECK-LABEL: TEST: ptx
# CHECK: .target sm_90a
# CHECK: wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2
# CHECK: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
