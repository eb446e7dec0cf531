"""A whole training step through IREE with our weight gradients: torch.export -> one vmfb -> run -> check.

A small conv net (3x3 and batch norm, grouped and strided 3x3, depthwise 3x3, 1x1) and its loss are exported with their
backward (``torch.export`` and ``_export_forward_backward``: forward and backward in one graph), compiled whole
by :func:`convbw_mlir.dispatch.module.compile_module` (IREE's input phase, ``convbw-raise`` and our pipeline on
each weight gradient, IREE for the rest), run on the host, and each weight gradient checked against torch's
autograd in float64. The weights are the module's constants (``import_frozen_program``); x is its input.

python examples/whole_module.py [--batch 2] [--size 12] [--target host]
"""

from __future__ import annotations

import argparse
import sys

try:
    import torch
    from torch import nn
except ModuleNotFoundError:
    sys.exit("examples/whole_module.py needs PyTorch: pip install .[torch]")

import numpy as np


class Net(nn.Module):
    """3x3 (4 -> 8) and batch norm (batch statistics: no running ones to update, which a joint export cannot
    return), grouped 3x3 stride 2 (G=2), depthwise 3x3 (G=8), 1x1 (8 -> 16); loss: mean of squares."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([
            nn.Conv2d(4, 8, 3, padding=1, bias=False),
            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False),
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
            nn.Conv2d(8, 16, 1, bias=False),
        ])  # fmt: skip
        self.norm = nn.BatchNorm2d(8, affine=False, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x) if i == len(self.convs) - 1 else torch.relu(self.norm(conv(x)) if i == 0 else conv(x))
        return (x * x).mean()


def export_step(net: nn.Module, x: torch.Tensor):  # -> torch.export.ExportedProgram
    """The training step (loss and the weights' gradients) as one exported program."""
    from torch.export.experimental import _export_forward_backward

    program = torch.export.export(net, (x,)).run_decompositions()
    return _export_forward_backward(program, joint_loss_index=0)


def reference_grads(net: Net, x: torch.Tensor) -> list[np.ndarray]:
    """torch's autograd in float64: the weight gradients the vmfb must give."""
    net64 = Net().double()
    net64.load_state_dict(net.state_dict())
    loss = net64(x.double())
    return [g.numpy() for g in torch.autograd.grad(loss, [c.weight for c in net64.convs])]


def run_vmfb(vmfb: bytes, x: np.ndarray, driver: str = "local-task") -> list[np.ndarray]:
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config(driver))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb))
    return [np.asarray(o.to_host()) for o in context.modules.module["main"](x)]


def main(argv: list[str] | None = None) -> float:
    """Compile, run and check; return the largest weight-gradient error relative to its largest value."""
    from convbw_mlir.dispatch.module import compile_module

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=12)
    p.add_argument("--target", default="host")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(args.batch, 4, args.size, args.size)
    program = export_step(net, x)
    compiled = compile_module(program, args.target, isolate=True)
    print(f"raised {len(compiled.raised)} weight gradients:")
    for r in compiled.raised:
        print(f"  {r.problem.name}  ({r.variant}, {r.why})")
    for line in compiled.not_raised:
        print(f"  left to IREE: {line}")
    loss, *grads = run_vmfb(compiled.vmfb, x.numpy())
    # the program's outputs: the loss, then one gradient per parameter in the signature's order
    order = [s.target for s in program.graph_signature.output_specs if s.target]
    expected = dict(zip([f"convs.{i}.weight" for i in range(len(net.convs))], reference_grads(net, x)))
    worst = 0.0
    for name, got in zip(order, grads):
        want = expected[name]
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        worst = max(worst, err)
        print(f"{name:16s} {str(got.shape):16s} max error {err:.2e} (relative to its largest value)")
    print(f"loss {float(loss):.6f}; worst {worst:.2e}: {'PASS' if worst < 1e-4 else 'FAIL'}")
    return worst


if __name__ == "__main__":
    sys.exit(0 if main() < 1e-4 else 1)
