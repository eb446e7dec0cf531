"""Regenerate lit/passes/Inputs/raise/*.mlir: ``aten.convolution_backward`` graphs exported from torch
(``torch.export``), imported by iree.compiler.extras.fx_importer and lowered by IREE's input phase
(``--compile-to=input``): the linalg ``convbw-raise`` meets in a real module.

    .venv/bin/python bench/raise_inputs.py      (needs torch; writes the files, locations stripped)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from convbw_mlir.dispatch.module import input_phase
from convbw_mlir.ir_imports import ir, new_context

OUT = Path(__file__).resolve().parent.parent / "lit" / "passes" / "Inputs" / "raise"

# name: N, C and K per group, G, input size, filter, stride, pad, dilation, dtype, output mask (dx, dW, db)
CASES = {
    "grouped_strided_dilated_f32": (2, 4, 6, 2, (8, 8), (3, 3), (2, 1), (1, 1), (1, 2), torch.float32, (0, 1, 0)),
    "dense_f16": (2, 4, 6, 1, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), torch.float16, (0, 1, 0)),
    "depthwise_bf16": (2, 1, 1, 4, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), torch.bfloat16, (0, 1, 0)),
    "conv1d_grouped_f32": (2, 4, 6, 2, (9,), (3,), (2,), (0,), (1,), torch.float32, (0, 1, 0)),
    "conv3d_f32": (1, 2, 3, 1, (4, 5, 6), (1, 2, 3), (1, 1, 1), (0, 1, 0), (1, 1, 1), torch.float32, (0, 1, 0)),
    "pointwise_f32": (2, 4, 6, 1, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), torch.float32, (0, 1, 0)),
    "dense_c64_f16": (4, 64, 64, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), torch.float16, (0, 1, 0)),
    "data_gradient_f32": (2, 4, 6, 2, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), torch.float32, (1, 0, 0)),
}


class ConvBackward(torch.nn.Module):
    def __init__(self, stride, pad, dilation, groups, mask) -> None:
        super().__init__()
        self.args = (list(stride), list(pad), list(dilation), False, [0] * len(stride), groups, [bool(m) for m in mask])

    def forward(self, x, dy, w):
        grads = torch.ops.aten.convolution_backward(dy, x, w, None, *self.args)
        return grads[0] if self.args[-1][0] else grads[1]


def export(n, c, k, g, size, f, stride, pad, dil, dtype, mask) -> str:
    x = torch.randn(n, c * g, *size, dtype=dtype)
    w = torch.randn(k * g, c, *f, dtype=dtype)
    conv = getattr(torch.nn.functional, f"conv{len(size)}d")
    y = conv(x.float(), w.float(), stride=stride, padding=pad, dilation=dil, groups=g).to(dtype)
    program = torch.export.export(ConvBackward(stride, pad, dil, g, mask), (x, torch.randn_like(y), w))
    with new_context():
        return ir.Module.parse(input_phase(program)).operation.get_asm(enable_debug_info=False)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, case in CASES.items():
        text = export(*case)
        (OUT / f"{name}.mlir").write_text(f"// {name}: bench/raise_inputs.py (torch {torch.__version__})\n{text}")
        print(f"wrote {OUT / name}.mlir")
    return 0


if __name__ == "__main__":
    sys.exit(main())
