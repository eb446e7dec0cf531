// convbw-plan decides once and records the decision on the op; the other passes only carry it out.
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942})' | FileCheck %s --check-prefix=PLAN
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 grouped=mma})' | FileCheck %s --check-prefix=SM80
// RUN: %convbw-opt %S/Inputs/conv1x1.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx1100})' | FileCheck %s --check-prefix=RDNA
// RUN: %convbw-opt %S/Inputs/depthwise.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 strategy=codegen})' | FileCheck %s --check-prefix=SIMT
// RUN: %convbw-opt %S/Inputs/depthwise.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80})' | FileCheck %s --check-prefix=DW

// Replayable from text: planning, printing, and running the rest on the printed IR gives the same module.
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --convbw-pipeline=gfx942 > %t.direct
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942})' > %t.planned
// RUN: %convbw-opt %t.planned --pass-pipeline='builtin.module(convbw-plan{target=gfx942},convbw-explicit-gemm,convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma,canonicalize,cse)' > %t.replayed
// RUN: diff %t.direct %t.replayed

// A plan in the input is kept as written, whatever the options: its split and tile reach IREE's config.
// RUN: %convbw-opt %S/Inputs/planned.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=4},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=KEPT

// Options are the plan's overrides, each checked where the pipeline is built or the plan decided.
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 tile-m=0})' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 tile-m=-16})' 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 stages=0})' 2>&1 | FileCheck %s --check-prefix=STAGES
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=host tile-m=64})' 2>&1 | FileCheck %s --check-prefix=HOSTTILE
// RUN: not %convbw-opt %S/Inputs/conv1x1.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 tile-n=64})' 2>&1 | FileCheck %s --check-prefix=GEMMTILE
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 grouped=ours})' 2>&1 | FileCheck %s --check-prefix=CHOICE
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx908})' 2>&1 | FileCheck %s --check-prefix=TARGET

// PLAN: "convbw.conv_bwd_weight"(%arg0, %arg1)
// PLAN-SAME: plan = {gemm = false, strategy = "mma", target = "gfx942", tile = {intrinsic = "MFMA_F32_16x16x16_F16", k = 64 : i64, m = 64 : i64, n = 16 : i64, stages = 2 : i64, subgroups_m = 4 : i64, subgroups_n = 1 : i64}}

// SM80: tile = {intrinsic = "NV_MMA_SYNC_F32_16x8x16_F16"

// RDNA takes our tile for a GEMM (its tile policy), planned on the GEMM form of the 1x1.
// RDNA: plan = {gemm = true, strategy = "mma", target = "gfx1100", tile = {intrinsic = "WMMAR3_F32_16x16x16_F16"

// Depthwise on sm_80: by default our depthwise kernel in its wide form (docs/decisions.md#depthwise-by-default) ...
// DW: plan = {depthwise = {channels = 16 : i64, chunks = 4 : i64, rows = 32 : i64, segment = 16 : i64, taps = 3 : i64, unroll = 8 : i64, vector = 4 : i64}, gemm = false, strategy = "explicit", target = "sm_80"}
// ... and codegen's where asked: too thin for matrix cores; the rows split and a thread tile.
// SIMT: plan = {gemm = false, simt = {channels = 1 : i64, groups = 16 : i64, rows = 8 : i64}, split = {chunk = 1 : i64, dim = "n,o0", k_batch = 16 : i64}, strategy = "simt", target = "sm_80"}

// KEPT: k_batch = 2 : i64, loops = ["s", "k", "f0", "f1", "c", "n", "o0", "o1"]
// KEPT-SAME: target = "gfx942"
// KEPT: convbw.tile = {intrinsic = "MFMA_F32_16x16x16_F16", k = 32 : i64, m = 32 : i64, n = 16 : i64, stages = 3 : i64, strategy = "mma", subgroups_m = 2 : i64, subgroups_n = 1 : i64}

// ZERO: convbw-opt: error: convbw-plan: tile-m: expected a positive integer, got 0
// NEGATIVE: convbw-opt: error: convbw-plan: tile-m: expected a positive integer, got -16
// STAGES: convbw-opt: error: convbw-plan: stages: expected a positive integer, got 0
// HOSTTILE: error: convbw-plan: tile-m: strategy iree takes no tile here (IREE's CPU codegen)
// GEMMTILE: error: convbw-plan: tile-n: strategy iree takes no tile here (a GEMM: IREE's own config on gfx942 (option gemm=mma gives ours))
// CHOICE: convbw-opt: error: convbw-plan: option 'grouped' expects one of mma, iree, got 'ours'
// TARGET: convbw-opt: error: convbw-plan: option 'target' expects one of host, gfx90a
