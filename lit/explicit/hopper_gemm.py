# The sm_90a GEMM (convbw_mlir/kernels/gemm_sm90.py) on a tiny problem: the IR our builders write
# (roles, setmaxnreg, mbarriers, TMA, wgmma on descriptors) and the PTX IREE 3.13 makes of it through the
# hand-written sm_90a target (targets.py: TARGETS["sm_90a"]): `.target sm_90a`, the Hopper instructions.
# RUN: %PYTHON %s | FileCheck %s
import tempfile
from pathlib import Path

from convbw_mlir.build.iree import compile_module
from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling, gemm_module

with new_context(), ir.Location.unknown():
    module = gemm_module(128, 64, 128, Sm90Tiling(bn=64, stages=2))
    assert module.operation.verify()
    text = str(module)
print("TEST: ir")
print(text)
# CHECK-LABEL: TEST: ir
# 1 producer + 2 consumer warpgroups
# CHECK: workgroup_size = [384 : index, 1 : index, 1 : index]
# CHECK: memref.alloc() : memref<{{[0-9]+}}xi8, #gpu.address_space<workgroup>>
# CHECK: nvvm.mbarrier.init
# CHECK: gpu.barrier
# CHECK: scf.if
# CHECK-NEXT: nvvm.setmaxregister decrease 40
# CHECK: nvvm.mbarrier.try_wait.parity
# CHECK: nvvm.mbarrier.arrive.expect_tx
# CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global
# CHECK: } else {
# CHECK-NEXT: nvvm.setmaxregister increase 232
# CHECK: nvvm.mbarrier.try_wait.parity
# CHECK: nvvm.wgmma.fence.aligned
# CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<f16>, <one>, <row>], B[<f16>
# CHECK: nvvm.wgmma.commit.group.sync.aligned
# CHECK: nvvm.wgmma.wait.group.sync.aligned 1
# CHECK: nvvm.mbarrier.arrive
# CHECK: nvvm.wgmma.wait.group.sync.aligned 0

with tempfile.TemporaryDirectory() as tmp:
    compile_module(text, "sm_90a", [f"--iree-hal-dump-executable-binaries-to={tmp}"])
    (ptx,) = Path(tmp).glob("*.ptx")
    print("TEST: ptx")
    print(ptx.read_text())
# CHECK-LABEL: TEST: ptx
# CHECK: .target sm_90a
# CHECK: .maxntid 384, 1, 1
# CHECK: mbarrier.init.shared.b64
# CHECK: setmaxnreg.inc.sync.aligned.u32 232
# CHECK: mbarrier.try_wait.parity.shared.b64
# CHECK: wgmma.fence.sync.aligned
# CHECK: wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16
# CHECK: wgmma.commit_group.sync.aligned
# CHECK: wgmma.wait_group.sync.aligned 1
# CHECK: setmaxnreg.dec.sync.aligned.u32 40
# CHECK: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
