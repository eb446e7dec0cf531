# The sm_90a weight gradient (convbw_mlir/kernels/conv_sm90.py) of a 3-D and a 1-D layer: x goes by a 5-D
# im2col map (coordinates (c, w, h, d, n), the tap's three offsets) and by a 3-D one ((c, w, n), one offset),
# in the IR our builders write and in the PTX IREE 3.13 makes of it through the hand-written sm_90a target.
# RUN: %PYTHON %s | FileCheck %s
import tempfile
from pathlib import Path

from convbw_mlir.build.iree import compile_module
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.conv_sm90 import ConvSm90, conv_module
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling

tiling = Sm90Tiling(bn=128, stages=2)
cases = {
    # R3D-18's strided 3x3x3 on a small clip: x [2, 4, 5, 5, 64]
    "3d": ConvSm90(n=2, d=4, h=5, w=5, c=64, k=64, fz=3, fy=3, fx=3, do=2, ho=3, wo=3, stride=(2, 2, 2),
                   dilation=(1, 1, 1), pad=(1, 1, 1), tiling=tiling),
    # a dilated 1-D layer: x [2, 40, 64]
    "1d": ConvSm90(n=2, h=1, w=40, c=64, k=64, fy=1, fx=3, ho=1, wo=36, stride=(1,), dilation=(2,), pad=(0,),
                   tiling=tiling),
}  # fmt: skip
for name, g in cases.items():
    with new_context(), ir.Location.unknown():
        module = conv_module(g)
        assert module.operation.verify()
        text = str(module)
    print(f"TEST: ir {name}")
    print(text)
    with tempfile.TemporaryDirectory() as tmp:
        compile_module(text, "sm_90a", [f"--iree-hal-dump-executable-binaries-to={tmp}"])
        (ptx,) = Path(tmp).glob("*.ptx")
        print(f"TEST: ptx {name}")
        print(ptx.read_text())
# CHECK-LABEL: TEST: ir 3d
# CHECK: memref<2x4x5x5x64xf16
# CHECK-COUNT-2: nvvm.cp.async.bulk.tensor{{.*}}, box[%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}]
# CHECK-SAME: im2col[%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}] mode = im2col
# CHECK-LABEL: TEST: ptx 3d
# CHECK: .target sm_90a
# CHECK: cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes
# CHECK-SAME: {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}], [%rd{{[0-9]+}}],
# CHECK-SAME: {%rs{{.*}}, %rs{{.*}}, %rs{{.*}}};
# CHECK-LABEL: TEST: ir 1d
# CHECK: memref<2x40x64xf16
# CHECK-COUNT-2: nvvm.cp.async.bulk.tensor{{.*}}, box[%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}]
# CHECK-SAME: im2col[%{{[0-9]+}}] mode = im2col
# CHECK-LABEL: TEST: ptx 1d
# CHECK: cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes
# CHECK-SAME: {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}], [%rd{{[0-9]+}}], {%rs{{[0-9]+}}};
