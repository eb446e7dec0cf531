# ruff: noqa: E501 - FileCheck lines match whole IR lines
# The depthwise kernel's f16/bf16 conversion on the tensor cores (policies/depthwise.py MMA_CONVERT): G = 16, N = 2,
# 3x3, 6x7, padding 1, 4 channels a thread, 3 row lanes of 12 threads (36) launched as 64 (whole warps: every
# lane runs the mma.sync; the 28 added threads own no rows). Each lane's B fragments of the identity's two 16x8
# halves are made once; a step's 18 raw f16 vectors (8 dy, 10 x) go through 9 A fragments of two vectors each,
# each times I_lo and I_hi: 18 mma.sync, no arith.extf, then the 24 FMAs.
# RUN: %PYTHON %s | FileCheck %s
from dataclasses import replace

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.explicit_kernel import ExplicitKernel

from convbw_mlir.ir_imports import new_context
from convbw_mlir.plan import decide
from convbw_mlir.policies import depthwise
from convbw_mlir.problem import ConvBwdWeightProblem

depthwise.MMA_CONVERT, depthwise.MMA_MIN_STEPS = ("f16", "bf16"), 0  # pinned: this form, whatever the defaults
depthwise.WIDE_UNROLL, depthwise.PREFETCH, depthwise.MAX_WINDOW = 8, False, 16
p = ConvBwdWeightProblem.from_ck("2 16 2 1 1 3 3 6 7 1 1 1 1 1 1 1 1")
plan = decide(p, "sm_80", strategy="explicit")
plan = replace(plan, depthwise=replace(plan.depthwise, vector=4, rows=3, chunks=2))
with new_context():
    module = convbw.build_module(p, plan)
    ExplicitKernel().run(module.operation)
    print(module)

# CHECK: workgroup_size = [64, 1, 1]
# CHECK: func.func @gemm
# CHECK: %[[LANE:.+]] = arith.remui %thread_id_x, %c32 : index
# CHECK: arith.cmpi eq
# CHECK: %[[LO:.+]] = vector.shape_cast %{{.+}} : vector<4xf16> to vector<2x2xf16>
# CHECK: %[[HI:.+]] = vector.shape_cast %{{.+}} : vector<4xf16> to vector<2x2xf16>
# The launched threads past the 3 row lanes own no rows.
# CHECK: arith.cmpi slt, %{{.+}}, %c3 : index
# CHECK: %[[RAW:.+]]:18 = scf.if %{{.+}} -> (vector<4xf16>, {{.*}}vector<4xf16>) {
# CHECK: } else {
# CHECK-NOT: arith.extf
# CHECK: %[[A:.+]] = vector.shape_cast %{{.+}} : vector<8xf16> to vector<4x2xf16>
# CHECK: nvgpu.mma.sync(%[[A]], %[[LO]], %{{.+}}) mmaShape = [16, 8, 16] : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
# CHECK: nvgpu.mma.sync(%[[A]], %[[HI]], %{{.+}}) mmaShape = [16, 8, 16] : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
# CHECK-COUNT-16: nvgpu.mma.sync
# CHECK-NOT: arith.extf
# CHECK-COUNT-24: math.fma
# The lanes' sums: shared memory for the 64 launched threads (6 lanes of 12), sums of the 3 row lanes.
# CHECK: memref.alloc() : memref<6x144xf32, #gpu.address_space<workgroup>>
