"""Compile side of the GPU benchmark: per problem, every contender as a vmfb plus a manifest.

Contenders, all functions ``(x, dy) -> dW`` in the problem's layout, so the runner treats them alike:
  * ``convbw``: our pipeline for the target.
  * ``reference``: the GPU reference (as CK's PR 3216 added): x and dy converted to f32 first, the
    plain contraction in f32 (no split-K, no tile config, no f16 matrix instructions: the ISA is
    checked and recorded), dW in f32. Simple and obviously correct; it verifies big problems on the GPU.
  * ``iree_direct``: IREE's default pipeline on the plain linalg form (``convbw-lower-to-linalg{frontend-form}``
    alone: tensor.pad, x first).
  * ``iree_torch``: IREE's default on the form torch-mlir hands it: transposes around
    ``linalg.conv_2d_nhwc_hwcf`` (x as [C, H, W, N] input, dy as [Ho, Wo, N, K] filter, stride and
    dilation swapped; x cut to the rows read along a single output row). 2-D, G=1, no epilogue only
    (the named op has no groups).
  * ``iree_fusilli``: the torch form (or the direct one where there is none) with the weight-backward
    flag set of iree-org/fusilli (docs/decisions.md#fusilli-flags; it includes IREE's split reduction).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.files import atomic_directory
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import Target

__all__ = [
    "CONTENDERS",
    "FUSILLI_FLAGS",
    "build_contender",
    "direct_contender",
    "build_form",
    "compile_contenders",
    "write_artifacts",
]

FUSILLI_FLAGS = [
    "--iree-opt-level=O3",
    "--iree-preprocessing-pass-pipeline=builtin.module(util.func(iree-preprocessing-convert-conv-filter-to-channels-last))",
    "--iree-flow-enable-pad-handling",
    "--iree-global-opt-propagate-transposes-through-conv",
    "--iree-global-opt-enable-sink-transpose-through-pad",
    "--iree-dispatch-creation-enable-fuse-padding-into-linalg-consumer-ops",
    "--iree-dispatch-creation-enable-aggressive-reshape-movement",
    "--iree-dispatch-creation-enable-split-reduction",
]
CONTENDERS = ("convbw", "reference", "iree_direct", "iree_torch", "iree_fusilli")


def _function(problem: ConvBwdWeightProblem, body, result_type) -> Any:
    """A module with ``func @conv_bwd_weight(x, dy) -> result_type`` whose body ``body(x, dy)`` builds."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import func_d, ir

    loc = convbw.problem_location(problem)
    module = ir.Module.create(loc=loc)
    with ir.InsertionPoint(module.body), loc:
        x_t, dy_t = convbw.tensor_type(problem, "x"), convbw.tensor_type(problem, "dy")
        fn = func_d.FuncOp("conv_bwd_weight", ir.FunctionType.get([x_t, dy_t], [result_type]))
        block = fn.add_entry_block()
        with ir.InsertionPoint(block):
            func_d.ReturnOp([body(block.arguments[0], block.arguments[1])])
    module.operation.verify()
    return module


def reference_module(problem: ConvBwdWeightProblem) -> Any:
    from convbw_mlir.builders import convert
    from convbw_mlir.ir_imports import ir
    from convbw_mlir.passes.explicit_gemm import window
    from convbw_mlir.passes.lower_to_linalg import build_contraction
    from convbw_mlir.plan import as_gemm

    p32 = problem.with_(dtype="f32", dw_dtype="f32")
    f32 = ir.F32Type.get()
    out_t = ir.RankedTensorType.get(problem.dw_shape, ir.F32Type.get())

    def body(x: Any, dy: Any) -> Any:  # tensor.pad and x first: the simplest form, as obvious as it gets
        p, x32, dy32 = p32, convert(x, f32), convert(dy, f32)
        if as_gemm(p32) is not None:
            # A strided 1x1 reads x at o * stride: a plain copy of those positions first. Read in place,
            # IREE 3.13 failed to compile the f32 form for sm_80 ("failed to pack reduction dimensions
            # for partial reduction"; CK's ck2d_b and ck3d_a).
            p, x32, dy32 = window(p32, x32, dy32)
        return build_contraction(p, x32, dy32, frontend_form=True)

    return _function(problem, body, out_t)


def torch_style_module(problem: ConvBwdWeightProblem) -> Any | None:
    """The torch-mlir form (2-D, G=1, no fused epilogue: torch's conv backward has none), or None."""
    from convbw_mlir.builders import as_value, convert, transpose
    from convbw_mlir.dialects import convbw
    from convbw_mlir.ir_imports import arith_d, ir, linalg_d, tensor_d

    p = problem
    if p.rank != 2 or p.groups != 1 or p.epilogue is not None:
        return None

    # Layouts with a size-1 G dimension: collapse it away first, then the same.
    def body_any(x: Any, dy: Any) -> Any:
        f32 = ir.F32Type.get()
        xl, yl = list(p.dims("x")), list(p.dims("dy"))
        if "G" in xl:
            x = _drop_unit(x, xl.index("G"))
            dy = _drop_unit(dy, yl.index("G"))
            xl.remove("G")
            yl.remove("G")
        xp = _exact_window(p, x, xl)
        x_in = transpose(xp, [xl.index(d) for d in ("C", "H", "W", "N")])
        dy_f = transpose(dy, [yl.index(d) for d in ("H", "W", "N", "K")])
        y, xs = p.filter_size
        out_shape = [p.in_channels, y, xs, p.out_channels]
        empty = tensor_d.EmptyOp(out_shape, f32)
        zero = arith_d.ConstantOp(f32, ir.FloatAttr.get(f32, 0.0))
        init = as_value(linalg_d.fill(zero.result, outs=[empty.result]))
        # dW = x (*) dy with the roles swapped: the conv's stride is the problem's dilation and vice versa.
        conv = linalg_d.conv_2d_nhwc_hwcf(x_in, dy_f, outs=[init], strides=list(p.dilation), dilations=list(p.stride))
        conv = as_value(conv)
        dw = conv  # [C, Y, X, K] f32
        if p.dw_dtype != "f32":
            from convbw_mlir.ir_imports import element_type

            dw = convert(dw, element_type(p.dw_dtype))
        wl = [d for d in p.dims("dw") if d != "G"]
        src = ["C", "Y", "X", "K"]
        dw = transpose(dw, [src.index(d) for d in wl])
        if "G" in p.dims("dw"):
            dw = _add_unit(dw, p.dims("dw").index("G"), p.dw_shape)
        return dw

    return _function(p, body_any, convbw.tensor_type(p, "dw"))


def _exact_window(problem: ConvBwdWeightProblem, x: Any, letters: list[str]) -> Any:
    """x padded as torch-mlir pads it, but cut to the rows read, ``(f - 1) * dil + 1``, along a single output row.

    With the roles swapped, the conv's output (dW's filter) size follows from its input's: once IREE drops
    the unit loop of a single output row, any row past those read (a stride that skips x's tail)
    contradicts it. Elsewhere linalg takes an input longer than the rows read, and torch-mlir's form stays.
    """
    from convbw_mlir.builders import leading_slice, pad_zeros

    low, high = [0] * len(letters), [0] * len(letters)
    keep: dict[int, int] = {}  # rows of x kept, before padding
    cut: dict[int, int] = {}  # rows of the padded x kept, where every read row is padding
    for i, letter in enumerate(("H", "W")):
        pos = letters.index(letter)
        size, lo = problem.input_size[i], problem.pad_low[i]
        needed = (
            (problem.output_size[i] - 1) * problem.stride[i] + (problem.filter_size[i] - 1) * problem.dilation[i] + 1
        )
        low[pos], high[pos] = lo, problem.pad_high[i]
        if problem.output_size[i] > 1 or needed == lo + size + high[pos]:
            continue
        if needed <= lo:
            high[pos], cut[pos] = 0, needed
        elif needed < lo + size:
            high[pos], keep[pos] = 0, needed - lo
        else:
            high[pos] = needed - lo - size
    if keep:
        x = leading_slice(x, keep)
    x = pad_zeros(x, low, high)
    return leading_slice(x, cut) if cut else x


def _unit_groups(rank: int, pos: int) -> list[list[int]]:
    """Reassociation joining the unit dimension ``pos`` (of a rank-``rank`` tensor) to a neighbour."""
    groups: list[list[int]] = []
    for i in range(rank):
        if i == pos and groups:
            groups[-1].append(i)
        elif i == pos + 1 and pos == 0:
            groups.append([0, i])
        elif i != pos:
            groups.append([i])
    return groups


def _drop_unit(value: Any, pos: int) -> Any:
    from convbw_mlir.builders import reassociation
    from convbw_mlir.ir_imports import ir, tensor_d

    shape = list(value.type.shape)
    new = shape[:pos] + shape[pos + 1 :]
    out_t = ir.RankedTensorType.get(new, value.type.element_type)
    return tensor_d.CollapseShapeOp(out_t, value, reassociation(_unit_groups(len(shape), pos))).result


def _add_unit(value: Any, pos: int, full_shape: tuple[int, ...]) -> Any:
    from convbw_mlir.builders import reassociation
    from convbw_mlir.ir_imports import ir, tensor_d

    out_t = ir.RankedTensorType.get(list(full_shape), value.type.element_type)
    groups = _unit_groups(len(full_shape), pos)
    return tensor_d.ExpandShapeOp(out_t, value, reassociation(groups), [], list(full_shape)).result


def _convbw_options(contender: str) -> dict[str, Any]:
    """``convbw:k_batch=8,gemm=mma``: our pipeline's options (variants for tuning runs)."""
    options = dict(kv.split("=", 1) for kv in contender.partition(":")[2].split(",") if kv)
    return {k: int(v) if v.isdigit() else v for k, v in options.items()}


def _reads_maps(problem: ConvBwdWeightProblem, target: str, options: dict[str, Any]) -> bool:
    """Whether our plan's kernel reads TMA tensor maps (sm_90a's wgmma and fp8 kernels): decided before any
    compile, so a plan IREE's runtime runs is compiled once."""
    from convbw_mlir.plan import PlanError, decide
    from convbw_mlir.policies import sm90, sm90_fp8
    from convbw_mlir.targets import get_target

    if not get_target(target).wgmma_n:
        return False
    try:
        plan = decide(problem, target, **options)
    except (PlanError, ValueError):
        return False  # the compile below says why, as for any target
    return sm90.is_sm90(plan) or sm90_fp8.is_fp8(plan)


def direct_contender(problem: ConvBwdWeightProblem, options: dict[str, Any], target: str, folder: Path,
                     path: str) -> dict[str, Any] | None:  # fmt: skip
    """Our kernel (the pipeline's ``options``) where only the direct launch runs it (sm_90a: TMA maps): built
    with an output argument, its schedule written beside the vmfb (``<path>.launch/``,
    :class:`convbw_mlir.measure.run.DirectKernel`); None where the plan's kernel reads no maps (IREE's runtime
    runs it)."""
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    op = build_op(problem, get_target(target), output_arg=True, **options)
    if op.launch is None or not op.launch.tensor_maps:
        return None
    (folder / path).write_bytes(op.vmfb)
    launch = folder / f"{path.removesuffix('.vmfb')}.launch"
    launch.mkdir(exist_ok=True)
    for name, data in op.launch.files().items():
        (launch / name).write_bytes(data)
    return {"ok": True, "vmfb": path, "flags": [], "launch": launch.name, "config": _config_of(op.stages["linalg"])}


def build_contender(problem: ConvBwdWeightProblem, contender: str, target: str) -> tuple[str | None, list[str]]:
    """(linalg IR text or None if the contender has no form for this problem, extra IREE flags)."""
    from convbw_mlir.build.compile import lowered_text, run_pipeline
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.passes import parse_pipeline
    from convbw_mlir.pipelines import for_target

    if contender == "convbw" or contender.startswith("convbw:"):
        return lowered_text(problem, for_target(target, **_convbw_options(contender))), []
    with new_context() as ctx, ir.Location.unknown():
        if contender == "reference":
            module = reference_module(problem)
            run_pipeline(module, parse_pipeline("canonicalize,cse"), ctx)
            return str(module), []
        torch_form = torch_style_module(problem)
        if contender == "iree_torch":
            return (str(torch_form) if torch_form is not None else None), []
        if contender == "iree_fusilli" and torch_form is not None:
            return str(torch_form), list(FUSILLI_FLAGS)
    frontend = parse_pipeline("convbw-lower-to-linalg{frontend-form=true},canonicalize,cse")
    return lowered_text(problem, frontend), (list(FUSILLI_FLAGS) if contender == "iree_fusilli" else [])


def build_form(problem: ConvBwdWeightProblem, target: Target, form: str, extra_flags: list[str] | None = None, *,
               output_arg: bool = False) -> CompiledOp:  # fmt: skip
    """One of IREE's own forms of ``problem`` (``iree_direct``, ``iree_torch``, ``iree_fusilli``) compiled for
    ``target``; ``output_arg`` as in compile_op (the same ABI as ours).

    Raises:
        CompileError: IREE failed, or the form has no IR for this problem.
    """
    from convbw_mlir.build.compile import _compile_vmfb, with_output_arg
    from convbw_mlir.build.iree import CompileError, iree_version

    text, flags = build_contender(problem, form, target.name)
    if text is None:
        raise CompileError(f"{form}: no such form for {problem.name}")
    flags = flags + list(extra_flags or [])
    if output_arg:
        text = with_output_arg(text)
    vmfb, launch = _compile_vmfb(text, target, flags)  # CUDA: with the direct launch's schedule
    return CompiledOp(problem, target.name, {"linalg": text}, vmfb, form, target.iree_flags() + flags,
                      iree_version(), launch=launch)  # fmt: skip


def compile_contenders(problem: ConvBwdWeightProblem, key: str, target: str, folder: Path,
                       contenders: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """In this process: compile ``contenders`` of one problem into ``folder``; a record per contender."""
    from convbw_mlir.build.iree import CompileError, compile_module, executable_intermediates
    from convbw_mlir.build.isa import report
    from convbw_mlir.targets import get_target

    gpu = get_target(target).is_gpu
    records: dict[str, Any] = {}
    for contender in contenders:
        try:
            text, flags = build_contender(problem, contender, target)
            if text is None:
                records[contender] = {"ok": False, "error": "no such form for this problem"}
                continue
            path = f"{key}.{contender.replace(':', '.').replace(',', '.').replace('=', '')}.vmfb"
            ours = _convbw_options(contender) if contender.startswith("convbw") else None
            direct = None
            if ours is not None and _reads_maps(problem, target, ours):  # run by the direct launch
                direct = direct_contender(problem, ours, target, folder, path)
            if direct is not None:
                records[contender] = direct
                continue
            rec: dict[str, Any] = {"ok": True, "vmfb": path, "flags": flags}
            if gpu and (
                contender.startswith("convbw") or contender == "reference"
            ):  # one compile gives the vmfb and the ISA
                inter = executable_intermediates(text, target, flags)
                vmfb = inter.vmfb
                rep = report(inter.files, target)
                rec["isa"] = rep.summary()
                rec["mma_count"] = rep.main.mma_count
            else:
                vmfb = compile_module(text, target, flags)
            if contender.startswith("convbw"):
                rec["config"] = _config_of(text)
            (folder / path).write_bytes(vmfb)
            records[contender] = rec
        except (CompileError, ValueError) as e:
            records[contender] = {
                "ok": False,
                "error": str(e).strip().splitlines()[0][:400] if str(e).strip() else "error",
            }
    return records


def _compile_isolated(problem: ConvBwdWeightProblem, key: str, target: str, folder: Path,
                      contenders: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """compile_contenders in a child process: IREE 3.13 crashes on some inputs, which must not end the run."""
    from convbw_mlir.build.isolate import CompilerCrash, call

    try:
        records = call(compile_contenders, problem, key, target, folder, contenders, what=f"{key} for {target}")
        return json.loads(json.dumps(records))  # as the manifest holds them
    except CompilerCrash as e:
        status = e.returncode
    except Exception:  # one compile_contenders does not record: the child's exit status 1, as a crash
        status = 1
    if len(contenders) == 1:
        return {contenders[0]: {"ok": False, "error": f"compiler crashed (exit {status})"}}
    out: dict[str, Any] = {}
    for c in contenders:  # find the one that crashes
        out |= _compile_isolated(problem, key, target, folder, (c,))
    return out


def write_artifacts(
    problems: list[tuple[str, ConvBwdWeightProblem]],
    target: str,
    out: str | os.PathLike,
    contenders: tuple[str, ...] = CONTENDERS,
) -> Path:
    """Compile every contender of every problem into ``out`` and write ``out/manifest.json``.

    A contender that fails to compile (or crashes the compiler) is recorded with its error: a result,
    not the end of the run. The folder is built beside ``out`` and moved into place at the end.
    """
    from importlib.metadata import version

    entries = []
    with atomic_directory(out) as tmp:
        for i, (name, problem) in enumerate(problems, 1):
            key = f"{name}.{problem.dtype}"
            records = _compile_isolated(problem, key, target, tmp, contenders)
            entries.append({"name": name, "key": key, "problem": problem.to_dict(), "contenders": records})
            if sys.stderr.isatty():
                print(f"\r{i}/{len(problems)} {key}", end="", file=sys.stderr)
        manifest = {
            "target": target,
            "date": str(datetime.date.today()),
            "iree_version": version("iree-base-compiler"),
            "contenders": list(contenders),
            "problems": entries,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Path(out)


def _config_of(text: str) -> dict[str, Any]:
    """What our passes chose, read back from the IR: k_batch, strategy and tile; an explicit kernel's from its
    plan (no ``convbw.tile`` follows it), with StreamK's ``streamk``, wave specialization's ``producers`` and the
    groups a GEMM of merged thin groups (``merge``)."""
    import re

    def entries(body: str) -> dict[str, Any]:
        found = re.findall(r'(\w+) = ("[^"]*"|\d+)', body)
        return {k: v.strip('"') if v.startswith('"') else int(v) for k, v in found}

    cfg: dict[str, Any] = {}
    m = re.search(r"k_batch = (\d+)", text)
    cfg["k_batch"] = int(m.group(1)) if m else 1
    m = re.search(r"convbw\.tile = \{([^}]*)\}", text)
    if m:
        cfg |= entries(m.group(1))
    m = re.search(r"convbw\.plan = \{", text)
    if m and "strategy" not in cfg:
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(text)):  # the plan's own braces
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        parts = dict(re.findall(r"(\w+) = \{([^}]*)\}", text[m.end() : end]))
        if entries(re.sub(r"\{[^}]*\}", "", text[m.end() : end])).get("strategy") == "explicit":
            cfg |= {"strategy": "explicit"} | entries(parts.get("tile", ""))
            if "streamk" in parts:
                cfg["streamk"] = entries(parts["streamk"])
            if "wavespec" in parts:
                cfg["producers"] = entries(parts["wavespec"])["producers"]
            if "merge" in parts:
                cfg["merge"] = entries(parts["merge"])["groups"]
    return cfg
