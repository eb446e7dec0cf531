"""Host kernels with the contenders' signature that misbehave: one kills its process, one never ends, one is
wrong (the runner's, the measuring pool's and the measuring server's containment tests)."""

from convbw_mlir.problem import ConvBwdWeightProblem


def segfaulting_kernel(problem: ConvBwdWeightProblem) -> bytes:
    """A vmfb with the contenders' signature that reads x a terabyte past its end: SIGSEGV on the host."""
    from convbw_mlir.build.iree import compile_module

    xs, ys, ws = ("x".join(map(str, s)) for s in (problem.x_shape, problem.dy_shape, problem.dw_shape))
    rank, zeros = len(problem.dw_shape), ", ".join(["%c0"] * (len(problem.x_shape) - 1))
    idx = ", ".join(f"d{i}" for i in range(rank))
    text = f"""
func.func @conv_bwd_weight(%x: tensor<{xs}xf16>, %dy: tensor<{ys}xf16>) -> tensor<{ws}xf16> {{
  %far0 = arith.constant 1099511627776 : index
  %far = util.optimization_barrier %far0 : index
  %c0 = arith.constant 0 : index
  %e = tensor.empty() : tensor<{ws}xf16>
  %r = linalg.generic {{indexing_maps = [affine_map<({idx}) -> ({idx})>],
                        iterator_types = [{", ".join(['"parallel"'] * rank)}]}} outs(%e : tensor<{ws}xf16>) {{
  ^bb0(%o: f16):
    %v = tensor.extract %x[%far, {zeros}] : tensor<{xs}xf16>
    linalg.yield %v : f16
  }} -> tensor<{ws}xf16>
  return %r : tensor<{ws}xf16>
}}"""
    return compile_module(text, "host")


def hanging_kernel(problem: ConvBwdWeightProblem) -> bytes:
    """A vmfb with the contenders' signature whose every thread loops forever."""
    from convbw_mlir.build.iree import compile_module

    xs, ys, ws = ("x".join(map(str, s)) for s in (problem.x_shape, problem.dy_shape, problem.dw_shape))
    rank = len(problem.dw_shape)
    idx = ", ".join(f"d{i}" for i in range(rank))
    text = f"""
func.func @conv_bwd_weight(%x: tensor<{xs}xf16>, %dy: tensor<{ys}xf16>) -> tensor<{ws}xf16> {{
  %t0 = arith.constant true
  %t = util.optimization_barrier %t0 : i1
  %z = arith.constant 0.0 : f16
  %e = tensor.empty() : tensor<{ws}xf16>
  %r = linalg.generic {{indexing_maps = [affine_map<({idx}) -> ({idx})>],
                        iterator_types = [{", ".join(['"parallel"'] * rank)}]}} outs(%e : tensor<{ws}xf16>) {{
  ^bb0(%o: f16):
    %v = scf.while (%a = %z) : (f16) -> f16 {{
      scf.condition(%t) %a : f16
    }} do {{
    ^bb1(%b: f16):
      %n = arith.addf %b, %b : f16
      scf.yield %n : f16
    }}
    linalg.yield %v : f16
  }} -> tensor<{ws}xf16>
  return %r : tensor<{ws}xf16>
}}"""
    return compile_module(text, "host")


def wrong_kernel(problem: ConvBwdWeightProblem) -> bytes:
    """A vmfb with the contenders' signature that returns dW all zeros: finite and wrong."""
    from convbw_mlir.build.iree import compile_module

    xs, ys, ws = ("x".join(map(str, s)) for s in (problem.x_shape, problem.dy_shape, problem.dw_shape))
    text = f"""
func.func @conv_bwd_weight(%x: tensor<{xs}xf16>, %dy: tensor<{ys}xf16>) -> tensor<{ws}xf16> {{
  %z = arith.constant 0.0 : f16
  %e = tensor.empty() : tensor<{ws}xf16>
  %r = linalg.fill ins(%z : f16) outs(%e : tensor<{ws}xf16>) -> tensor<{ws}xf16>
  return %r : tensor<{ws}xf16>
}}"""
    return compile_module(text, "host")
