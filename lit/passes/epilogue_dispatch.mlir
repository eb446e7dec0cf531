// The fused epilogue adds no dispatch: per strategy on sm_80, the plain problem and the same problem
// with a bilinear epilogue (alpha = beta = 2, D f32) compile to the same number of dispatches, and D
// is an operand of the dispatch that writes dW (the contraction's unsplit, split-K's stage 2 split).
// DEFINE: %{flow} = iree-compile - --iree-hal-target-device=cuda --iree-cuda-target=sm_80 --compile-to=flow
// DEFINE: %{bil} = --alpha 2 --beta 2 --d-type f32

// mma, unsplit (3x3, k-batch 1): pad + contraction.
// RUN: %convbw-opt --ck "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | FileCheck %s --check-prefix=MMA-PLAN
// RUN: %convbw-opt --ck "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=MMA-PLAIN
// RUN: %convbw-opt --ck "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1" %{bil} --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=MMA
// MMA-PLAN: strategy = "mma"
// MMA-PLAIN-COUNT-2: flow.dispatch @
// MMA-PLAIN-NOT: flow.dispatch @
// MMA: flow.dispatch @{{.+}}elementwise
// MMA: flow.dispatch @{{.+}}_conv_{{.+}}(%{{.+}}, %{{.+}}, %{{.+}}) : ({{.+}}, tensor<64x3x3x64xf32>) -> tensor<64x3x3x64xf16>
// MMA-NOT: flow.dispatch @

// simt, unsplit (depthwise, k-batch 1): pad + contraction.
// RUN: %convbw-opt --ck "2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | FileCheck %s --check-prefix=SIMT-PLAN
// RUN: %convbw-opt --ck "2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=SIMT-PLAIN
// RUN: %convbw-opt --ck "2 32 8 1 1 3 3 28 28 1 1 1 1 1 1 1 1" %{bil} --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=SIMT
// SIMT-PLAN: strategy = "simt"
// SIMT-PLAIN-COUNT-2: flow.dispatch @
// SIMT-PLAIN-NOT: flow.dispatch @
// SIMT: flow.dispatch @{{.+}}elementwise
// SIMT: flow.dispatch @{{.+}}_conv_{{.+}}(%{{.+}}, %{{.+}}, %{{.+}}) : ({{.+}}, tensor<32x3x3xf32>) -> tensor<32x3x3xf16>
// SIMT-NOT: flow.dispatch @

// iree, unsplit (a 1x1 as a GEMM, k-batch 1): the GEMM alone.
// RUN: %convbw-opt --ck "2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-explicit-gemm,convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | FileCheck %s --check-prefix=IREE-PLAN
// RUN: %convbw-opt --ck "2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-explicit-gemm,convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=IREE-PLAIN
// RUN: %convbw-opt --ck "2 1 32 128 128 1 1 28 28 1 1 1 1 0 0 0 0" %{bil} --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=1},convbw-explicit-gemm,convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=IREE
// IREE-PLAN: strategy = "iree"
// IREE-PLAIN-COUNT-1: flow.dispatch @
// IREE-PLAIN-NOT: flow.dispatch @
// IREE: flow.dispatch @{{.+}}_matmul_like_{{.+}}(%{{.+}}, %{{.+}}, %{{.+}}) : ({{.+}}, tensor<128x128xf32>) -> tensor<128x128xf16>
// IREE-NOT: flow.dispatch @

// split-K (3x3, k-batch 4, mma stage 1): pad + partial sums + stage 2, which reads D.
// RUN: %convbw-opt --ck "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1" --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=4},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=SPLIT-PLAIN
// RUN: %convbw-opt --ck "2 1 32 64 64 3 3 14 14 1 1 1 1 1 1 1 1" %{bil} --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=4},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' | %{flow} | FileCheck %s --check-prefix=SPLIT
// SPLIT-PLAIN-COUNT-3: flow.dispatch @
// SPLIT-PLAIN-NOT: flow.dispatch @
// SPLIT: flow.dispatch @{{.+}}elementwise
// SPLIT: flow.dispatch @{{.+}}_conv_{{.+}}(%{{.+}}, %{{.+}}) : ({{.+}}) -> tensor<4x64x3x3x64xf32>
// SPLIT: flow.dispatch @{{.+}}_reduction_{{.+}}(%{{.+}}, %{{.+}}) : (tensor<4x36864xf32>, tensor<36864xf32>) -> tensor<36864xf16>
// SPLIT-NOT: flow.dispatch @
