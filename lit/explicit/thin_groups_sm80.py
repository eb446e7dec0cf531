# ruff: noqa: E501 - FileCheck lines match whole IR lines
# Thin groups in the depthwise kernel's grouped form (strategy explicit, layout 2): G = 4 groups of C = 3 in
# and K = 5 out channels (odd), 3x3, 6x7, padding 1. x binds as
# [N, H, W, G*C], dy as [N, H, W, G*K], the f32 workspace as [chunks, G, K, taps*C] (dW's GKYXC order); a
# thread's vector is its group's in channels (1 here: 3 is odd) and dy's value of its out channel multiplies it.
# The grouped form is not the plan's choice (strategy=explicit gives thin groups the implicit GEMM, which takes
# odd channels): it is reached by a stored plan, as a tuner's or a user's (docs/explicit-kernels.md "Depthwise").
# RUN: %PYTHON %s | FileCheck %s
from convbw_mlir.dialects import convbw
from convbw_mlir.passes.explicit_kernel import ExplicitKernel

from convbw_mlir.ir_imports import new_context
from convbw_mlir.plan_data import Plan, Strategy
from convbw_mlir.policies import depthwise
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import get_target

p = ConvBwdWeightProblem.from_ck("2 4 2 5 3 3 3 6 7 1 1 1 1 1 1 1 1")
plan = Plan("sm_80", Strategy.EXPLICIT, depthwise=depthwise._rule(p, get_target("sm_80")))
with new_context():
    module = convbw.build_module(p, plan)
    ExplicitKernel().run(module.operation)
    print(module)

# CHECK: %[[DY:.+]] = hal.interface.binding.subspan {{.*}} binding(0) {{.*}} : memref<2x6x7x20xf16>
# CHECK: %[[X:.+]] = hal.interface.binding.subspan {{.*}} binding(1) {{.*}} : memref<2x6x7x12xf16>
# CHECK: %[[WS:.+]] = hal.interface.binding.subspan {{.*}} binding(2) {{.*}} : memref<{{[0-9]+}}x4x5x27xf32>
# The thread's x channel (group * 3 + in channel) and dy channel (group * 5 + out channel).
# CHECK: %[[G:.+]] = arith.addi %{{.+}}, %{{.+}} : index
# CHECK: arith.muli %[[G]], %c3 : index
# CHECK: arith.muli %[[G]], %c5 : index
# CHECK: scf.if
# CHECK: vector.load %[[DY]][{{.*}}] : memref<2x6x7x20xf16>, vector<1xf16>
# CHECK: vector.load %[[X]][{{.*}}] : memref<2x6x7x12xf16>, vector<1xf16>
# CHECK: math.fma {{.*}} : vector<1xf32>
# CHECK: vector.store %{{.+}}, %[[WS]][{{.*}}] : memref<{{[0-9]+}}x4x5x27xf32>, vector<1xf32>
# CHECK: tensor.collapse_shape %arg0 {{\[}}[0], [1], [2], [3, 4]] : tensor<2x6x7x4x3xf16> into tensor<2x6x7x12xf16>
# CHECK: tensor.collapse_shape %arg1 {{\[}}[0], [1], [2], [3, 4]] : tensor<2x6x7x4x5xf16> into tensor<2x6x7x20xf16>
# CHECK: flow.dispatch @convbw_explicit_0::@gemm({{.*}}) {convbw.plan = {depthwise = {{.*}} : (tensor<2x6x7x20xf16>, tensor<2x6x7x12xf16>) -> tensor<{{[0-9]+}}x4x5x27xf32>
# CHECK: tensor.expand_shape {{.*}} into tensor<4x5x3x3x3xf16>
