"""A model's training step (forward, loss, backward) as one ``torch.export`` program whose parameters are inputs.

``_export_forward_backward`` gives the joint graph with the parameters lifted as constants of the program; here
they become the program's first user inputs (and their gradients plain outputs after the loss), so that a saved
``.pt2`` holds no weights (a few hundred KB for ResNeXt-101) and IREE's importer makes them function arguments,
not constants: ``main(params..., x) -> (loss, grads...)``. Needs torch only (no IREE, no convbw_mlir): it runs on
the GPU machine, whose torch (2.11) and torchvision export the zoo, and here.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["export_step", "loss_of", "params_as_inputs", "trainable"]


def loss_of(out: Any) -> torch.Tensor:
    """Mean of squares over every tensor of a model's output (a tensor, a tuple, a dict or a ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out.float().square().mean()
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else None
    if values is None:
        raise TypeError(f"model output: expected tensors, a tuple or a dict of them, got {type(out).__name__}")
    losses = [loss_of(v) for v in values if isinstance(v, (torch.Tensor, dict, list, tuple))]
    if not losses:
        raise TypeError("model output: holds no tensor")
    return torch.stack(losses).sum()


class _Step(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return loss_of(self.model(*inputs))


def trainable(model: nn.Module, *inputs: torch.Tensor) -> list[str]:
    """Turn off ``requires_grad`` of the parameters the loss does not reach (an eval-mode auxiliary head: the joint
    export refuses a parameter without a gradient); found by one step on the ``meta`` device. Returns their names."""
    try:
        meta = copy.deepcopy(model).to("meta")
        loss_of(meta(*(x.to("meta") for x in inputs))).backward()
    except Exception:  # noqa: BLE001 - a model that does not run on meta: the export itself says what it lacks
        return []
    unused = [n for n, p in meta.named_parameters() if p.requires_grad and p.grad is None]
    params = dict(model.named_parameters())
    for n in unused:
        params[n].requires_grad_(False)
    return unused


def params_as_inputs(program: Any) -> Any:
    """The joint ``program`` with its parameters as user inputs (in their order, before the model's inputs) and the
    loss and the parameters' gradients as user outputs; buffers stay constants."""
    from torch.export import ExportedProgram
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec

    sig = program.graph_signature
    params = {s.target for s in sig.input_specs if s.kind == InputKind.PARAMETER}
    ins = [InputSpec(InputKind.USER_INPUT, s.arg, None, None) if s.kind == InputKind.PARAMETER else s
           for s in sig.input_specs]  # fmt: skip
    lifted = (OutputKind.GRADIENT_TO_PARAMETER, OutputKind.LOSS_OUTPUT)
    outs = [OutputSpec(OutputKind.USER_OUTPUT, s.arg, None) if s.kind in lifted else s for s in sig.output_specs]
    n_in = sum(s.kind == InputKind.USER_INPUT for s in ins)
    n_out = sum(s.kind == OutputKind.USER_OUTPUT for s in outs)
    in_spec = pytree.tree_flatten((tuple(range(n_in)), {}))[1]
    out_spec = pytree.tree_flatten(tuple(range(n_out)))[1]
    top = ModuleCallEntry(fqn="", signature=ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec,
                                                                 out_spec=out_spec))  # fmt: skip
    graph_module = program.graph_module
    return ExportedProgram(
        root=graph_module, graph=graph_module.graph, graph_signature=ExportGraphSignature(ins, outs),
        state_dict={k: v for k, v in program.state_dict.items() if k not in params},
        range_constraints=program.range_constraints,
        module_call_graph=[top, *(copy.deepcopy(m) for m in program.module_call_graph if m.fqn)],
        example_inputs=None, constants=program.constants, verifiers=list(program.verifiers),
    )  # fmt: skip


def export_step(model: nn.Module, *inputs: torch.Tensor) -> Any:
    """``model``'s training step on ``inputs`` (eval mode: batch norm reads its running statistics, which a joint
    export cannot update; dropout off) as an ``ExportedProgram``: ``main(params..., *inputs) -> (loss, grads...)``,
    one gradient per parameter that requires one, in ``named_parameters`` order."""
    from torch.export.experimental import _export_forward_backward

    model.eval()
    trainable(model, *inputs)
    program = torch.export.export(_Step(model), tuple(inputs)).run_decompositions()
    return params_as_inputs(_export_forward_backward(program, joint_loss_index=0))
