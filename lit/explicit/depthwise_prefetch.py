# ruff: noqa: E501 - FileCheck lines match whole IR lines
# The depthwise kernel reading a step ahead (policies/depthwise.py PREFETCH): G = 16, N = 2, 3x3, 6x7, padding 1,
# 4 outputs a step, cvt conversions. A row's first step is read before the steps loop; the loop carries the 3
# accumulators and the 10 raw f16 vectors of the step it works on (4 dy, 6 x); its body reads step min(i + 1, last)
# first (the interior scf.if), then converts and multiplies step i's, and yields the next step's vectors.
# RUN: %PYTHON %S/Inputs/depthwise_switches.py --ck "2 16 2 1 1 3 3 6 7 1 1 1 1 1 1 1 1" --waves 8 --unroll 4 --mma none --prefetch 1 | FileCheck %s

# CHECK: func.func @gemm
# The row's first step, before the loop.
# CHECK: %[[FIRST:.+]]:10 = scf.if %{{.+}} -> (vector<4xf16>, {{.*}}vector<4xf16>) {
# CHECK: scf.for %[[I:.+]] = %c0 to %c{{[0-9]+}} step %c1 iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf16>, {{.*}}vector<4xf16>) {
# The next step (clamped to the last), read first.
# CHECK: %[[NEXT:.+]] = arith.addi %[[I]], %c1 : index
# CHECK: arith.minsi %[[NEXT]], %c{{[0-9]+}} : index
# CHECK: %[[AHEAD:.+]]:10 = scf.if %{{.+}} -> (vector<4xf16>, {{.*}}vector<4xf16>) {
# CHECK: } else {
# Then this step's: 10 conversions of the carried vectors, 12 FMAs.
# CHECK-COUNT-10: arith.extf %arg{{[0-9]+}} : vector<4xf16> to vector<4xf32>
# CHECK-COUNT-12: math.fma
# CHECK: scf.yield %{{.+}}, %{{.+}}, %{{.+}}, %[[AHEAD]]#0,
