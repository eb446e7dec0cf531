# RUN: %PYTHON %s | FileCheck %s
# The Python API as a user writes it, one case per TEST label (upstream MLIR's python test style).

from convbw_mlir.dialects import convbw
from convbw_mlir.passes import format_pipeline, parse_pipeline

from convbw_mlir import ConvBwdWeightProblem, compile_op
from convbw_mlir.ir_imports import new_context
from convbw_mlir.pipelines import pipeline_text
from convbw_mlir.reference import assert_close, random_inputs, reference


def run(f):
    print(f"\nTEST: {f.__name__}")
    f()
    return f


# CHECK-LABEL: TEST: build_op_reads_back_the_problem
@run
def build_op_reads_back_the_problem():
    p = ConvBwdWeightProblem.from_ck("3 2 2 8 4 3 3 3 6 6 6 2 2 2 1 1 1 1 1 1 0 0 0", dtype="bf16", layout=0)
    with new_context():
        module = convbw.build_module(p)
        op = module.body.operations[0].regions[0].blocks[0].operations[0]
        # CHECK: "convbw.conv_bwd_weight"(%arg0, %arg1)
        # CHECK-SAME: layout = "GNCHW/GKCYX/GNKHW"
        # CHECK-SAME: (tensor<2x2x4x6x6x6xbf16>, tensor<2x2x8x3x3x3xbf16>) -> tensor<2x8x4x3x3x3xbf16>
        print(op)
        # CHECK: round trip: True
        print("round trip:", convbw.problem_of(op) == p)
        # CHECK: loc("conv_bwd_weight:3d_g2_n2_c4_k8_f3x3x3
        print(op.location)


# CHECK-LABEL: TEST: pipelines_are_one_definition
@run
def pipelines_are_one_definition():
    # CHECK: builtin.module(convbw-plan{target=host k-batch=auto reduction-innermost=false},
    # CHECK-SAME: convbw-explicit-gemm,convbw-split-k,convbw-lower-to-linalg{frontend-form=false},canonicalize,cse)
    print(pipeline_text("host"))
    # CHECK: convbw-plan{target=sm_80 k-batch=8 tile-m=64 reduction-innermost=false}
    # CHECK-SAME: convbw-tile,convbw-map-mma,canonicalize,cse)
    print(pipeline_text("sm_80", k_batch=8, tile_m=64))
    # CHECK: builtin.module(convbw-lower-to-linalg{frontend-form=false},cse)
    print(format_pipeline(parse_pipeline("builtin.module(convbw-lower-to-linalg,cse)")))


# CHECK-LABEL: TEST: compile_run_verify_on_host
@run
def compile_run_verify_on_host():
    p = ConvBwdWeightProblem(groups=3, batch=2, in_channels=5, out_channels=7, input_size=(9,), filter_size=(3,),
                             stride=2, pad_low=1, pad_high=0, dtype="f16")  # fmt: skip
    op = compile_op(p, "host")
    x, dy = random_inputs(p)
    dw = op.run(x, dy)
    err = assert_close(p, dw, reference(p, x, dy))
    # CHECK: stages: ['convbw', 'linalg']
    print("stages:", list(op.stages))
    # CHECK: dw: (3, 7, 3, 5) float16 ok: True
    print("dw:", dw.shape, dw.dtype, "ok:", err < 1e-3)
