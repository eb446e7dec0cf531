// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942},convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=GFX942
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx950 tile-n=32},convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=GFX950
// RUN: %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 strategy=codegen},convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=SM80
// RUN: %convbw-opt %S/Inputs/conv1x1.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942},convbw-explicit-gemm,convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=GEMM
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-plan{target=gfx942 tile-m=24},convbw-lower-to-linalg,convbw-tile)' 2>&1 | FileCheck %s --check-prefix=BADTILE
// RUN: %convbw-opt %S/Inputs/depthwise.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=rows},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=SIMT
// RUN: %convbw-opt %S/Inputs/depthwise.mlir --pass-pipeline='builtin.module(convbw-plan{target=sm_80 k-batch=2},convbw-split-k,convbw-lower-to-linalg,convbw-tile,convbw-map-mma)' | FileCheck %s --check-prefix=SIMTBATCH
// RUN: not %convbw-opt %S/Inputs/conv3x3.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,convbw-tile)' 2>&1 | FileCheck %s --check-prefix=NOPLAN

// K=36 pads to a 64 tile (next power of two, not 128), 4 waves along it; C=8 to one 16-wide intrinsic. IGEMM loops
// [k, y, x, c, red]: workgroup in elements, subgroup and reduction in intrinsic counts, padding given.
// GFX942: #translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [256, 1, 1] subgroup_size = 64
// GFX942-SAME: prefetch_num_stages = 2
// GFX942-SAME: use_igemm_convolution = true
// GFX942: #compilation = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<MFMA_F32_16x16x16_F16>, padding = [64, 1, 1, 16, 64], promote_operands = [0, 1], reduction = [0, 0, 0, 0, 4], subgroup = [1, 1, 1, 1, 0], workgroup = [64, 1, 1, 16, 0]}>, translation_info = #translation>
// GFX942: linalg.generic {{.*}} ins(
// GFX942-SAME: compilation_info = #compilation
// GFX942: convbw.tile = {intrinsic = "MFMA_F32_16x16x16_F16", k = 64 : i64, m = 64 : i64, n = 16 : i64, stages = 2 : i64, strategy = "mma", subgroups_m = 4 : i64, subgroups_n = 1 : i64}

// gfx950 doubles the intrinsic's K: reduction 2 x 32 = 64 elements; tile-n overrides the N tile.
// GFX950: mma_layout<MFMA_F32_16x16x32_F16>
// GFX950-SAME: reduction = [0, 0, 0, 0, 2]
// GFX950-SAME: workgroup = [64, 1, 1, 32, 0]

// IREE codegen asked for (the plan alone takes the explicit kernel for this channels-last G=1 problem).
// SM80: subgroup_size = 32
// SM80: mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>

// A plain GEMM (after convbw-explicit-gemm) is left to IREE's contraction heuristics.
// GEMM: strategy = "iree"
// GEMM-NOT: compilation_info

// BADTILE: error: convbw-plan: tile-m: 24 is not a multiple of 1 subgroups x 16 (MFMA_F32_16x16x16_F16)

// Depthwise over a rows split: the SIMT config. Loops [n, o0, g, f0, f1 | o1]: a workgroup of 8 rows x 16
// groups = 128 threads (whole warps), each thread one (n, o0, g) with all 3x3 taps, o1 reduced serially.
// SIMT: #translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32>
// SIMT: lowering_config<{reduction = [0, 0, 0, 0, 0, 1], thread = [1, 1, 1, 3, 3, 0], workgroup = [1, 8, 16, 3, 3, 0]}>
// SIMT: convbw.tile = {channels = 1 : i64, groups = 16 : i64, rows = 8 : i64, strategy = "simt"}

// Over a batch split it keeps IREE's own reduction config.
// SIMTBATCH: convbw.tile = {strategy = "simt"}
// SIMTBATCH-NOT: compilation_info

// The GPU passes carry out the plan the contraction holds; without one they say which pass makes it.
// NOPLAN: error: convbw-tile: the contraction has no plan; run convbw-plan before convbw-lower-to-linalg
