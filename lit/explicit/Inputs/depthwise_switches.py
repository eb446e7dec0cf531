"""Print a depthwise problem's module after convbw-plan and convbw-explicit-kernel with the depthwise policy's
switches pinned (the lit tests check one form whatever the shipped defaults are).

    python depthwise_switches.py --ck "2 16 2 1 1 3 3 6 7 1 1 1 1 1 1 1 1" --target sm_80 --waves 8 --unroll 8 \\
        --mma none --prefetch 0 [--strategy explicit]
"""

import argparse

from convbw_mlir.dialects import convbw
from convbw_mlir.passes.explicit_kernel import ExplicitKernel

from convbw_mlir.ir_imports import new_context
from convbw_mlir.plan import decide
from convbw_mlir.policies import depthwise
from convbw_mlir.problem import ConvBwdWeightProblem

ap = argparse.ArgumentParser()
ap.add_argument("--ck", required=True)
ap.add_argument("--target", default="sm_80")
ap.add_argument("--waves", type=int, default=8)
ap.add_argument("--unroll", type=int, default=8)
ap.add_argument("--mma", default="none", help="comma-separated types, or none")
ap.add_argument("--prefetch", type=int, default=0)
args = ap.parse_args()
depthwise.WAVES, depthwise.WIDE_UNROLL = args.waves, args.unroll
depthwise.MMA_CONVERT = () if args.mma == "none" else tuple(args.mma.split(","))
depthwise.MMA_MIN_STEPS, depthwise.MAX_WINDOW = 0, 16
depthwise.PREFETCH = bool(args.prefetch)
p = ConvBwdWeightProblem.from_ck(args.ck)
plan = decide(p, args.target, strategy="explicit")
with new_context():
    module = convbw.build_module(p, plan)
    ExplicitKernel().run(module.operation)
    print(module)
