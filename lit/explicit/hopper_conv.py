# The sm_90a weight gradient (convbw_mlir/kernels/conv_sm90.py) of a tiny 3x3, pad 1, stride 2 layer with 2
# splits: the IR our builders write (roles, setmaxnreg, mbarriers, dy's tiled TMA, x's im2col TMA with the
# tap's offsets, MN-major wgmma) and the PTX IREE 3.13 makes of it through the hand-written sm_90a target.
# RUN: %PYTHON %s | FileCheck %s
import tempfile
from pathlib import Path

from convbw_mlir.build.iree import compile_module
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

g = ConvSm90(n=6, h=9, w=9, c=64, k=128, fy=3, fx=3, ho=5, wo=5, stride=(2, 2), pad=(1, 1),
             tiling=Sm90Tiling(bn=128, stages=2), splits=2)  # fmt: skip
with new_context(), ir.Location.unknown():
    module = conv_module(g)
    assert module.operation.verify()
    text = str(module)
print("TEST: ir")
print(text)
# CHECK-LABEL: TEST: ir
# grid: 576 / 128 column tiles, 1 row tile, 2 splits; f32 partials [splits, G, K, Y X C]
# CHECK: hal.return %{{.*}}, %{{.*}}, %{{.*}} : index, index, index
# CHECK: workgroup_size = [384 : index, 1 : index, 1 : index]
# CHECK: memref<2x1x128x576xf32>
# CHECK: nvvm.mbarrier.init
# CHECK: scf.if
# CHECK-NEXT: nvvm.setmaxregister decrease 40
# CHECK: nvvm.mbarrier.try_wait.parity
# CHECK: nvvm.mbarrier.arrive.expect_tx
# dy: a 2-D tiled box per consumer; x: an im2col box per 64 columns, (c, w, h, n) and the tap's (w, h) offsets
# CHECK-COUNT-2: nvvm.cp.async.bulk.tensor.shared.cluster.global %{{.*}}, %{{.*}}, %{{.*}}, box[%{{.*}}, %{{.*}}] :
# CHECK-COUNT-2: nvvm.cp.async.bulk.tensor{{.*}}, box[%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}]
# CHECK-SAME: im2col[%{{[0-9]+}}, %{{[0-9]+}}] mode = im2col
# CHECK: } else {
# CHECK-NEXT: nvvm.setmaxregister increase 232
# CHECK: nvvm.wgmma.fence.aligned
# both operands MN-major: A col, B row (the transpose bits)
# CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 128, k = 16>, D[<f32>, <one>],
# CHECK-SAME: A[<f16>, <one>, <col>], B[<f16>, <one>, <row>]
# CHECK: nvvm.wgmma.wait.group.sync.aligned 1
# CHECK: nvvm.wgmma.wait.group.sync.aligned 0

with tempfile.TemporaryDirectory() as tmp:
    compile_module(text, "sm_90a", [f"--iree-hal-dump-executable-binaries-to={tmp}"])
    (ptx,) = Path(tmp).glob("*.ptx")
    print("TEST: ptx")
    print(ptx.read_text())
# CHECK-LABEL: TEST: ptx
# CHECK: .target sm_90a
# CHECK: setmaxnreg.inc.sync.aligned.u32 232
# imm-trans-a 1, imm-trans-b 1
# CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{.*}}, p, 1,{{ +}}1, 1,{{ +}}1;
# CHECK: setmaxnreg.dec.sync.aligned.u32 40
# CHECK: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
# CHECK: cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes
# CHECK-SAME: {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}], [%rd{{[0-9]+}}], {%rs{{.*}}, %rs{{.*}}};
