// The IR printing flags print to stderr around the passes they name, like mlir-opt.
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,cse)' --mlir-print-ir-after-all -o %t.out 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,cse)' --mlir-print-ir-before=convbw-lower-to-linalg -o %t.out 2>&1 | FileCheck %s --check-prefix=BEFORE
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,cse)' --mlir-print-ir-after=cse -o %t.out 2>&1 | FileCheck %s --check-prefix=AFTER

// ALL:      // -----// IR Dump After convbw-lower-to-linalg{frontend-form=false} //----- //
// ALL:      linalg.generic
// ALL:      // -----// IR Dump After cse //----- //
// ALL-NOT:  IR Dump

// BEFORE:      // -----// IR Dump Before convbw-lower-to-linalg{frontend-form=false} //----- //
// BEFORE-NEXT: module {
// BEFORE:      "convbw.conv_bwd_weight"
// BEFORE-NOT:  IR Dump

// AFTER-NOT:  IR Dump After convbw-lower-to-linalg
// AFTER:      // -----// IR Dump After cse //----- //
// AFTER:      linalg.generic
