"""torch.library.opcheck of convbw::conv_weight on a device (tests/test_torch_ops.py runs it on the CPU), and dW
bit-identical run to run (deterministic mode's promise, docs/torch.md#the-switch).

    CONVBW_ARTIFACTS=.art/torch python bench/torch_cuda_checks.py --precompile sm_80     (here: the compiler)
    CONVBW_ARTIFACTS=.art/torch python3 bench/torch_cuda_checks.py --device cuda --out checks.json  (GPU)

``--precompile`` also compiles the problem of bench/torch_switch_overhead.py, so both run where IREE is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from convbw_mlir import torch as ct

CL, CONTIGUOUS = torch.channels_last, torch.contiguous_format
# (x format, dy format) as tests/test_torch_ops.py's opcheck test; "strided": an x dense in neither format
CASES = {"contiguous": (CONTIGUOUS, CONTIGUOUS), "channels-last": (CL, CL), "x-cl-dy-contiguous": (CL, CONTIGUOUS),
         "x-contiguous-dy-cl": (CONTIGUOUS, CL), "strided-x": ("strided", CONTIGUOUS)}  # fmt: skip
ARGS = ([8, 4, 3, 3], [1, 1], [1, 1], [1, 1], 1)


def inputs(case: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    x_fmt, dy_fmt = CASES[case]
    g = torch.Generator().manual_seed(1)
    if x_fmt == "strided":
        x = torch.randn(2, 4, 6, 12, generator=g).to(device)[..., ::2]
    else:
        x = torch.randn(2, 4, 6, 6, generator=g).to(device).contiguous(memory_format=x_fmt)
    return x, torch.randn(2, 8, 6, 6, generator=g).to(device).contiguous(memory_format=dy_fmt)


def precompile(target: str) -> int:
    from convbw_mlir import compile_op

    if not os.environ.get(ct.ARTIFACTS_ENV):
        sys.exit(f"--precompile: set ${ct.ARTIFACTS_ENV} to the folder the GPU run will read")
    problems = {}
    for fmt in (CONTIGUOUS, CL):  # the op copies other inputs into one of these two
        x = torch.empty(2, 4, 6, 6).contiguous(memory_format=fmt)
        dy = torch.empty(2, 8, 6, 6).contiguous(memory_format=fmt)
        problems[fmt] = ct.problem_for(x, ARGS[0], dy, *ARGS[1:])[0]
    # bench/torch_switch_overhead.py's problem
    x = torch.empty(1, 8, 4, 4).contiguous(memory_format=CL)
    problems["overhead"] = ct.problem_for(x, (8, 8, 3, 3), torch.empty(1, 8, 4, 4).contiguous(memory_format=CL), 1, 1)[
        0
    ]
    for problem in problems.values():
        folder = ct.artifact_dir(problem, target)
        print(problem.name, flush=True)
        if not (folder / "op.json").is_file():
            compile_op(problem, target, isolate=True, output_arg=True).save(folder)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=50, help="calls compared bit for bit")
    p.add_argument("--out")
    p.add_argument("--precompile", metavar="TARGET")
    args = p.parse_args(argv)
    if args.precompile:
        return precompile(args.precompile)
    op = torch.ops.convbw.conv_weight.default
    result = {"torch": torch.__version__, "device": args.device, "cases": {}}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name()
    for case in CASES:
        x, dy = inputs(case, args.device)
        want = torch.nn.grad.conv2d_weight(x.double(), ARGS[0], dy.double(), padding=1)
        got = op(x, dy, *ARGS)
        rel = ((got.double() - want).norm() / want.norm()).item()
        checks = torch.library.opcheck(op, (x, dy, *ARGS))
        same = all(torch.equal(op(x, dy, *ARGS), got) for _ in range(args.repeats))
        result["cases"][case] = {"relative_error_vs_float64": rel, "opcheck": checks, "bit_identical_repeats": same}
        print(f"{case:20s} rel.err {rel:.1e}  opcheck {sorted(set(checks.values()))}  "
              f"{args.repeats} repeats bit-identical: {same}", flush=True)  # fmt: skip
    ok = all(
        set(c["opcheck"].values()) == {"SUCCESS"}
        and c["bit_identical_repeats"]
        and c["relative_error_vs_float64"] < 1e-3
        for c in result["cases"].values()
    )
    result["all_passed"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print("all passed" if ok else "NOT all passed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
