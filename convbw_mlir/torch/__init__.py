"""PyTorch entry point (needs torch, the ``[torch]`` extra): our weight gradient on torch tensors, on torch's
device, without copies (docs/torch.md).

- :func:`conv_weight` (and :func:`conv1d_weight`, :func:`conv2d_weight`, :func:`conv3d_weight`): the
  signature and result of ``torch.nn.grad.conv{1,2,3}d_weight``; :class:`ConvWeightGrad` and
  :func:`convert_model` (``entry``).
- the custom op ``convbw::conv_weight`` and the switch :func:`enable` / :func:`disable` that routes torch's own
  weight gradients to us (``switch``).
"""

from convbw_mlir.torch.entry import (
    ARTIFACTS_ENV,
    GRAPHS_ENV,
    LAUNCH_ENV,
    ConvWeightGrad,
    artifact_dir,
    conv1d_weight,
    conv2d_weight,
    conv3d_weight,
    conv_weight,
    convert_model,
    cuda_target,
    kernel_family,
    loaded_kernels,
    problem_for,
    target_for,
)
from convbw_mlir.torch.switch import (
    disable,
    enable,
    enabled,
    is_enabled,
    plan_is_deterministic,
    reset_stats,
    stats,
)

__all__ = [
    "ARTIFACTS_ENV",
    "GRAPHS_ENV",
    "LAUNCH_ENV",
    "ConvWeightGrad",
    "artifact_dir",
    "conv1d_weight",
    "conv2d_weight",
    "conv3d_weight",
    "conv_weight",
    "convert_model",
    "cuda_target",
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    "kernel_family",
    "loaded_kernels",
    "plan_is_deterministic",
    "problem_for",
    "reset_stats",
    "stats",
    "target_for",
]
