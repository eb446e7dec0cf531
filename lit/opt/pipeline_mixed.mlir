// A pipeline mixing convbw passes with MLIR's canonicalize and cse, from a file and from stdin.
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s
// RUN: cat %S/Inputs/conv.mlir | %convbw-opt - --pass-pipeline='builtin.module(convbw-lower-to-linalg,canonicalize,cse)' | FileCheck %s
// RUN: cat %S/Inputs/conv.mlir | %convbw-opt --pass-pipeline='convbw-lower-to-linalg,func.func(canonicalize)' | FileCheck %s
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg)' -o %t.mlir
// RUN: FileCheck %s --input-file %t.mlir
// RUN: %convbw-opt %S/Inputs/conv.mlir --pass-pipeline='builtin.module(convbw-lower-to-linalg{frontend-form=true},cse)' | FileCheck %s --check-prefix=FRONTEND

// CHECK-LABEL: func.func @conv
// CHECK-NOT:   convbw.conv_bwd_weight
// CHECK-NOT:   tensor.pad
// CHECK:       tensor.extract
// CHECK:       linalg.generic
// CHECK:       arith.truncf

// FRONTEND:    tensor.pad
// FRONTEND-NOT: tensor.extract
// FRONTEND:    linalg.generic
