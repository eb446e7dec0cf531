// IREE has no lowering for tosa.custom: it reports it from its worker threads.
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "tosa.custom"(%a) {domain_name = "d", operator_name = "op", implementation_attrs = ""} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
