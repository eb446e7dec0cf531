"""Weight gradients in layout 2 (NHWGC/GKYXC/NHWGK, channels-last): the explicit sm_80 kernel against
cuDNN and the product's current default kernel, side by side in one run (docs/explicit-kernels.md).

Compile here (needs the IREE compiler), run there (needs iree-base-runtime, numpy, torch):

    .venv/bin/python bench/explicit_conv.py compile DIR            # ours + the product's default, sm_80
    python3 explicit_conv.py run DIR --out OUT --budget 150        # on the GPU machine

Problems: the dense 2-D suite problems (seeds + models, G=1), ResNet-50's 3x3 layer of issue 14
(``2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1``) and its 1x1 1024->256 layer; ``compile --ranks 1 3``
takes the dense 1-D and 3-D suite problems instead (or beside, ``--ranks 1 2 3``), ``--types f16 bf16``
each problem in each input type (dW of the same type; a bf16 problem's name ends in ``_bf16``). Until
those were measured the plan does not choose our kernel for bf16 or 1-D/3-D gathers by itself, so
``product`` there is IREE's codegen kernel. ``compile`` writes
``DIR/<kind>_<problem>.vmfb`` and ``DIR/manifest.json`` (ours: ``compile_op(strategy="explicit")``, the
plan's own tiling and split; alt: the 128x256 recipe tiling where the plan's rule chose another;
product: ``compile_op`` with the default plan, ``cache=False``; all isolated), and records what the
explicit kernel refuses with its PlanError.

``run`` runs ours and the product's kernel one child process per problem (a CUDA fault poisons a
process) and cuDNN (``torch.nn.grad.conv{1,2,3}d_weight``, channels_last, ``cudnn.benchmark``) in one
child. Children run one at a time unless ``--jobs N`` starts N at once, so that their set-up (torch, IREE,
the PTX JIT, CUPTI) overlaps; each takes the GPU's machine-wide lock (``harness.device_lock``): shared for its
GPU work (context, copies, reference, check), alone for its timing and cuDNN's algorithm search: nothing
overlaps a timing. Each result is checked against a float64 reference on the GPU (cached per problem), then
timed by CUPTI (torch.profiler): ``single`` = median kernel time a call over calls 10 ms apart, ``sustained`` =
kernel time a call over a back-to-back stream. Past ``--budget`` seconds nothing new starts and
running children are stopped; what did not fit is listed as skipped. Writes ``OUT/explicit_conv.json``
and ``.md`` (and ``rows.json`` after each child, what a cut-off run still returns).

``compile --depthwise`` takes the depthwise layers instead (the suites' MobileNetV2, EfficientNet and
conformer layers and the ConvNeXt / MobileNetV3 ones of :data:`DEPTHWISE`): ours is then the depthwise kernel
(``plan.depthwise``: its rule's wide form, 4 channels a thread, a whole filter row of up to 8 taps, steps of
8 outputs), alt its narrow form (8 channels a thread, runs of up to 4 taps, steps of 4: :func:`_narrow`).
``compile --thin`` takes the thin-group layers of :data:`THIN` (ResNeXt, RegNet): ours is the depthwise
kernel's grouped form (its policy's plan, given as a stored plan), alt the implicit GEMM one group at a time
(``strategy=explicit``, ``merge_groups=1``), merged the implicit GEMM of several groups at once (``plan.merge``,
the policy's rule or, where it merges none, the most groups whose out channels fit 64: :func:`_merge_groups`),
merged_full the same without skipping the MMA tiles off the block diagonal (a stored plan), each in its own
child; the report adds a table of the three forms (:func:`_thin_lines`). Every IREE
contender reads x and dy from buffers followed by NaN (``runtime.FENCE_BYTES``): an over-read shows.

``compile --layout4`` takes layout-4 problems (NGCHW/GKCYX/NGKHW, torch's NCHW with groups): the layout-4 problems
of ``classes.tsv`` named in ``bench/classes.py`` LAYOUT4, ResNet-50's 3x3 64@56 at N = 32 and the dense 2-D suite
layers, each in layout 4 (docs/decisions.md#layout4). Contenders: ours (the plan's default: the channels-last kernel
between transposes where it takes the problem), gather (the layout-4 kernel that gathers x:
``strategy=explicit``), product (the product's choice before the relayout: ``layout4=gather``), alt (the relayout
asked for, ``strategy=explicit layout4=relayout``, where ours is not it: the depthwise kernel in layout 2), fold
(layout 4's kernel without a gather, ``layout4=fold``, where it takes the problem: stride 1, outputs as wide as x)
and cuDNN on contiguous NCHW tensors. The run side then makes NCHW inputs and compares dW in GKCYX.

A CPU rehearsal of the run side: ``compile DIR --smoke`` (host kernels of the product's default in
place of both of ours and the product's, a few small problems) and ``EXPLICIT_CONV_DEVICE=cpu``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script (its docstring says how)

from convbw_mlir.measure.cupti import kernel_events

SEED = 7
SINGLE_REPS = 10
SUSTAINED_CALLS = 100
DEVICE = os.environ.get("EXPLICIT_CONV_DEVICE", "cuda")

EXTRA = {
    "resnet50_3x3_256_n256_14": "2 1 256 256 256 3 3 14 14 1 1 1 1 1 1 1 1",
    "resnet50_1x1_1024to256_n256_14": "2 1 256 256 1024 1 1 14 14 1 1 1 1 0 0 0 0",
}
# Depthwise layers beside the suites' (layout 2, N = 32): ConvNeXt-T's 7x7 (stages 1 and 3), MobileNetV3-Large's
# 5x5 stride 2 (72 channels, 56 -> 28).
DEPTHWISE = {
    "convnext_t_dw7x7_g96_56": "2 96 32 1 1 7 7 56 56 1 1 1 1 3 3 3 3",
    "convnext_t_dw7x7_g384_14": "2 384 32 1 1 7 7 14 14 1 1 1 1 3 3 3 3",
    "mobilenetv3_dw5x5_g72_56_s2": "2 72 32 1 1 5 5 56 56 2 2 1 1 2 2 2 2",
}
# Thin groups (layout 2, N = 32): ResNeXt-50 32x4d's and ResNeXt-101 32x8d's first-stage 3x3, RegNetX-400MF's
# third stage (group width 16).
THIN = {
    "resnext50_32x4d_g32_c4_56": "2 32 32 4 4 3 3 56 56 1 1 1 1 1 1 1 1",
    "resnext101_32x8d_g32_c8_56": "2 32 32 8 8 3 3 56 56 1 1 1 1 1 1 1 1",
    "regnetx400mf_g10_c16_14": "2 10 32 16 16 3 3 14 14 1 1 1 1 1 1 1 1",
    # the classes suite's other thin layers (bench/results/h100_2026-11-25_classes_before)
    "resnext50_32x4d_g32_c8_28_s2": "2 32 32 8 8 3 3 56 56 2 2 1 1 1 1 1 1",
    "regnetx400mf_g4_c16_28": "2 4 32 16 16 3 3 28 28 1 1 1 1 1 1 1 1",
    "resnext50_32x4d_g32_c16_14": "2 32 32 16 16 3 3 14 14 1 1 1 1 1 1 1 1",
}
SMOKE = {
    "small_3x3": "2 1 2 16 8 3 3 6 6 1 1 1 1 1 1 1 1",
    "small_1x1": "2 1 2 8 16 1 1 5 5 1 1 1 1 0 0 0 0",
    "small_1d_k3_s2": "1 1 2 16 8 3 20 2 1 1 1",
    "small_3d_3x3x3": "3 1 2 16 8 3 3 3 5 6 6 1 2 1 1 1 2 1 1 1 1 1 1",
}
TYPES = ("f16", "bf16")


# -- compile side ------------------------------------------------------------------------------------
def problems(smoke: bool = False, ranks: tuple[int, ...] = (2,), types: tuple[str, ...] = ("f16",),
             depthwise: bool = False, thin: bool = False, layout4: bool = False) -> dict[str, Any]:  # fmt: skip
    """name -> problem in layout 2: the dense suite problems (G=1) of ``ranks``, then (rank 2) the ResNet-50
    layers (``depthwise``: the suites' depthwise layers of any rank and :data:`DEPTHWISE`); each in every
    input type of ``types`` (dW of that type; names of bf16 ones end in ``_bf16``). ``layout4``: the problems
    of :func:`layout4_problems` (the smoke ones with ``smoke``), in layout 4."""
    from convbw_mlir.problem import ConvBwdWeightProblem as P
    from convbw_mlir.suites import load_suite

    base = {}
    if layout4:
        base = layout4_problems(smoke)
    elif thin:
        base = {name: P.from_ck(line) for name, line in THIN.items()}
    elif depthwise:
        for name, p in load_suite("models"):
            if p.in_channels == 1 and p.out_channels == 1:
                base[name] = p.with_(layout=2)
        base.update({name: P.from_ck(line) for name, line in DEPTHWISE.items()})
    elif smoke:
        base = {name: P.from_ck(line) for name, line in SMOKE.items() if P.from_ck(line).rank in ranks}
    else:
        for suite in ("seeds", "models"):
            for name, p in load_suite(suite):
                if p.groups == 1 and p.rank in ranks:
                    base[name] = p.with_(layout=2)
        if 2 in ranks:
            base.update({name: P.from_ck(line) for name, line in EXTRA.items()})
    return {name + ("" if t == "f16" else f"_{t}"): p.with_(dtype=t, dw_dtype=t) for t in types
            for name, p in base.items()}  # fmt: skip


# Layout 4 beside the suites' layers: ResNet-50's first-stage 3x3 (64 channels, 56x56) at N = 32.
LAYOUT4_EXTRA = {"resnet50_3x3_64_n32_56": "2 1 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1"}


def layout4_problems(smoke: bool = False) -> dict[str, Any]:
    """name -> problem in layout 4: ``classes.tsv``'s problems named in ``bench/classes.py`` LAYOUT4,
    :data:`LAYOUT4_EXTRA` and the dense 2-D suite layers (G=1); with ``smoke``, :data:`SMOKE`'s."""
    from classes import LAYOUT4  # bench/classes.py, beside this script

    from convbw_mlir.problem import ConvBwdWeightProblem as P
    from convbw_mlir.suites import load_suite

    if smoke:
        return {name: P.from_ck(line).with_(layout=4) for name, line in SMOKE.items()}
    base = {name: p.with_(layout=4) for name, p in load_suite("classes") if name in LAYOUT4}
    base.update({name: P.from_ck(line).with_(layout=4) for name, line in LAYOUT4_EXTRA.items()})
    for suite in ("seeds", "models"):
        for name, p in load_suite(suite):
            if p.groups == 1 and p.rank == 2:
                base[name] = p.with_(layout=4)
    return base


def _layout4_kinds(p: Any, target: str) -> dict[str, Any]:
    """Layout 4's contenders of ``p`` (compiled, isolated, uncached; a refused one is left out: its error
    raised only where ours is refused)."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError

    def build(**options: Any) -> Any:
        return compile_op(p, target, isolate=True, cache=False, **options)

    if target == "host":  # the CPU rehearsal: the host kernel stands in for every kind (plumbing only)
        return {kind: build() for kind in ("ours", "gather", "product", "fold")}
    kinds = {"ours": build()}
    for kind, options in (("gather", {"strategy": "explicit"}), ("product", {"layout4": "gather"}),
                          ("alt", {"strategy": "explicit", "layout4": "relayout"}),
                          ("fold", {"layout4": "fold"})):  # fmt: skip
        if kind == "alt" and kinds["ours"].plan.channels_last:
            continue  # ours is the relayout already
        try:
            kinds[kind] = build(**options)
        except (PlanError, CompileError) as e:
            print(f"  {kind}: refused: {str(e).splitlines()[0]}", flush=True)
    return kinds


def _entry(name: str, kind: str, p: Any, plan: Any, suite: bool) -> dict[str, Any]:
    return {
        "name": f"{kind}:{name}",
        "kind": kind,
        "problem": name,
        "suite": suite,
        "vmfb": f"{kind}_{name}.vmfb" if kind != "cudnn" else None,
        **harness.problem_fields(p),
        "dtype": p.dtype,
        "layout": p.layout_family.ck_code,
        "pad_high": list(p.pad_high),
        "plan": plan.to_dict() if plan is not None else None,
    }


def compile_all(folder: Path, smoke: bool = False, only: list[str] | None = None, ranks: tuple[int, ...] = (2,),
                types: tuple[str, ...] = ("f16",), depthwise: bool = False, thin: bool = False,
                layout4: bool = False) -> None:  # fmt: skip
    """Compile ours and the product's default for every problem into ``folder`` (vmfbs, manifest.json)."""
    from dataclasses import replace

    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import Overrides, PlanError, decide
    from convbw_mlir.policies import depthwise as depthwise_policy
    from convbw_mlir.targets import get_target

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    target = "host" if smoke else "sm_80"
    for name, p in problems(smoke, ranks, types, depthwise, thin, layout4).items():
        if only and not any(o in name for o in only):
            continue
        suite = name.removesuffix("_bf16") not in {**EXTRA, **DEPTHWISE, **THIN, **LAYOUT4_EXTRA}
        if layout4 and not smoke:  # the classes' layers are beside the dense suite too
            from classes import LAYOUT4

            suite = suite and name not in LAYOUT4
        t0 = time.time()
        kinds = {}
        try:
            if layout4:
                kinds = _layout4_kinds(p, target)
            elif smoke:  # no sm_80 on the CPU: the product's host kernel stands in for ours (plumbing only)
                kinds["ours"] = compile_op(p, target, isolate=True, cache=False)
            elif thin:  # the grouped form as a stored plan; the implicit GEMM one group and m groups at a time
                grouped = depthwise_policy.plan(p, get_target(target), Overrides())
                kinds["ours"] = compile_op(p, target, plan=grouped, isolate=True, cache=False)
                kinds["alt"] = compile_op(p, target, strategy="explicit", merge_groups=1, isolate=True, cache=False)
                merge = _merge_groups(p, get_target(target))
                kinds["merged"] = compile_op(p, target, strategy="explicit", merge_groups=merge, isolate=True,
                                             cache=False)  # fmt: skip
                plan = kinds["merged"].plan  # the same without the skip of the MMA tiles off the diagonal
                full = replace(plan, merge=replace(plan.merge, skip_off_diagonal=False))
                kinds["merged_full"] = compile_op(p, target, plan=full, isolate=True, cache=False)
            else:
                plan = decide(p, target, strategy="explicit")
                kinds["ours"] = compile_op(p, target, strategy="explicit", isolate=True, cache=False)
                if plan.depthwise is not None:  # the narrow form beside the rule's (wide): checks the rule
                    alt = _narrow(p, plan)
                    if alt is not None:
                        kinds["alt"] = compile_op(p, target, plan=alt, isolate=True, cache=False)
                elif (plan.tile.m, plan.tile.n) != (128, 256):  # the recipe tiling beside the rule's: checks the rule
                    kinds["alt"] = compile_op(p, target, strategy="explicit", tile_n=256, isolate=True, cache=False)
        except (PlanError, CompileError) as e:
            refused[name] = str(e)
        try:
            if not layout4:
                same = next((op for op in kinds.values() if op.plan == decide(p, target)), None)
                kinds["product"] = same or compile_op(p, target, isolate=True, cache=False)  # the plan's own: once
        except CompileError as e:
            refused[f"product:{name}"] = str(e)
        for kind, op in kinds.items():
            (folder / f"{kind}_{name}.vmfb").write_bytes(op.vmfb)
            entries.append(_entry(name, kind, p, op.plan, suite))
        entries.append(_entry(name, "cudnn", p, None, suite))
        print(f"{name}: {', '.join(kinds)} in {time.time() - t0:.1f} s", flush=True)
    harness.write_manifest(folder, {"target": target, "entries": entries, "refused": refused, "seed": SEED,
                                    "layout": 4 if layout4 else 2})  # fmt: skip


def _merge_groups(p: Any, target: Any) -> int:
    """The merged contender's groups a GEMM: the policy's rule, else the most groups (dividing G) whose out
    channels fit the 64-row tile, so the form is measured where the rule does not choose it too."""
    from convbw_mlir.policies import sm80

    rule = sm80.merge_rule(p, target)
    fits = [m for m in range(2, p.groups + 1) if p.groups % m == 0 and m * p.out_channels <= sm80.MERGE_ROWS]
    return rule if rule > 1 else max(fits, default=1)


def _narrow(p: Any, plan: Any) -> Any:
    """The depthwise plan's narrow form (the rule's numbers before its wide form: 8 channels a thread, runs of
    up to 4 taps, steps of 4 outputs); None where it is the plan itself."""
    from dataclasses import replace

    from convbw_mlir.policies import depthwise
    from convbw_mlir.targets import get_target

    narrow = depthwise._rule(p, get_target(plan.target), wide=False)
    return None if narrow == plan.depthwise else replace(plan, depthwise=narrow)


# -- run side: one child --------------------------------------------------------------------------------
def _scratch(folder: Path) -> Path:
    """The run's lock and cached references: in the temp dir (the artifact folder may be read-only)."""
    path = Path(tempfile.gettempdir()) / f"explicit_conv_{zlib.crc32(str(folder.resolve()).encode()):08x}"
    path.mkdir(exist_ok=True)
    return path


def _layout4(e: dict) -> bool:
    """Whether the entry is in layout 4 (NGCHW/GKCYX/NGKHW: torch's contiguous NCHW), else layout 2."""
    return e.get("layout") == 4


def _inputs(e: dict, torch: Any) -> tuple[Any, Any]:
    """x ``[N, H, W, G*C]`` and dy ``[N, Ho, Wo, G*K]`` (any rank's spatial sizes) in the entry's input type
    (layout 2's memory; layout 4: ``[N, G*C, H, W]`` and ``[N, G*K, Ho, Wo]``), seeded, on the host."""
    g = torch.Generator(device="cpu").manual_seed(SEED)
    n, grp = e["images"], e["groups"]
    if _layout4(e):
        x = torch.randn(n, grp * e["in_channels"], *e["input_size"], generator=g)
        dy = torch.randn(n, grp * e["out_channels"], *e["output_size"], generator=g)
    else:
        x = torch.randn(n, *e["input_size"], grp * e["in_channels"], generator=g)
        dy = torch.randn(n, *e["output_size"], grp * e["out_channels"], generator=g)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[e.get("dtype", "f16")]
    return x.to(dtype), dy.to(dtype)


def _channels_first(t: Any) -> Any:
    """An NHWC (NWC, NDHWC) tensor seen as NCHW: torch's channels_last."""
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def _torch_weight(e: dict, x: Any, dy: Any, torch: Any) -> Any:
    """torch's weight gradient of channels-last tensors seen as channels_last NCHW (layout 4: of the
    contiguous NCHW tensors themselves): ``[G*K, C, Y, X]``."""
    if _layout4(e):
        return harness.conv2d_weight(e, x, dy, torch)
    return harness.conv2d_weight(e, _channels_first(x), _channels_first(dy), torch)


def _as_gkyxc(e: dict, w: Any) -> Any:
    """``[G*K, C, Y, X]`` -> ``[G, K, Y, X, C]`` (GKYXC, the layout-2 dW; any rank's filter); layout 4:
    ``[G, K, C, Y, X]`` (GKCYX, its dW, the same memory)."""
    if _layout4(e):
        return w.reshape(e["groups"], e["out_channels"], e["in_channels"], *e["filter_size"])
    w = w.permute(0, *range(2, w.dim()), 1)
    return w.reshape(e["groups"], e["out_channels"], *e["filter_size"], e["in_channels"])


def _numpy(t: Any, torch: Any) -> Any:
    """A host tensor as numpy (bf16 as ml_dtypes.bfloat16, which iree-base-runtime brings)."""
    if t.dtype != torch.bfloat16:
        return t.cpu().numpy()
    import ml_dtypes

    return t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def _reference(e: dict, x: Any, dy: Any, folder: Path, torch: Any) -> Any:
    """float64 dW (GKYXC) on the device, computed once per problem and cached for the run's other children."""
    cache = _scratch(folder) / f"{e['problem']}.pt"
    if cache.is_file():
        return torch.load(cache).to(DEVICE)
    ref = _as_gkyxc(e, _torch_weight(e, x.double(), dy.double(), torch)).contiguous()
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    torch.save(ref.cpu(), tmp)
    tmp.replace(cache)
    return ref


def _contender(e: dict, folder: Path, x: Any, dy: Any, torch: Any):
    """(call, as_torch, sync): run once on device-resident inputs; the result as a GKYXC tensor; a wait."""
    if e["kind"] == "cudnn":
        torch.backends.cudnn.benchmark = True
        # NHWC memory seen as NCHW is torch's channels_last (layout 4: contiguous NCHW); the CPU rehearsal
        # checks the plumbing in f32
        xc, dyc = (x, dy) if DEVICE == "cuda" else (x.float(), dy.float())
        sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
        return (lambda: _torch_weight(e, xc, dyc, torch)), (lambda r: _as_gkyxc(e, r)), (lambda _r: sync())
    n, grp = e["images"], e["groups"]
    if _layout4(e):  # NGCHW, NGKHW
        xs = _numpy(x, torch).reshape(n, grp, e["in_channels"], *e["input_size"])
        dys = _numpy(dy, torch).reshape(n, grp, e["out_channels"], *e["output_size"])
    else:
        xs = _numpy(x, torch).reshape(n, *e["input_size"], grp, e["in_channels"])
        dys = _numpy(dy, torch).reshape(n, *e["output_size"], grp, e["out_channels"])
    from convbw_mlir.runtime import Kernel

    kernel = Kernel((folder / e["vmfb"]).read_bytes(), "cuda" if DEVICE == "cuda" else "local-task")
    args = [kernel.to_device_fenced(a) for a in (xs, dys)]  # NaN after each: an over-read shows in dW
    harness.KEEP.append((kernel, args))
    call = lambda: kernel(*args)  # noqa: E731
    return call, (lambda r: torch.from_numpy(r.to_host().astype("float64"))), (lambda r: r.to_host())


# What CUPTI records of a launch (torch.profiler's kernel events): registers and occupancy tell why a
# variant with more warps (wave specialization) runs fewer blocks an SM.
LAUNCH_FACTS = ("registers per thread", "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %",
                "grid", "block")  # fmt: skip


def _launch_facts(trace: Path) -> dict[str, Any]:
    """The longest kernel's launch facts (LAUNCH_FACTS) from a chrome trace of torch.profiler."""
    events = [ev for ev in json.loads(trace.read_text()).get("traceEvents", []) if ev.get("cat") == "kernel"]
    if not events:
        return {}
    args = max(events, key=lambda ev: ev.get("dur", 0)).get("args", {})
    return {k: args[k] for k in LAUNCH_FACTS if k in args}


def _measure(e: dict, folder: Path, x: Any, dy: Any, torch: Any) -> dict[str, Any]:
    """Check one contender against float64 and time it (the caller holds the GPU's shared turn)."""
    rec: dict[str, Any] = {"name": e["name"], "kind": e["kind"], "problem": e["problem"], "flops": e["flops"]}
    call, as_torch, sync = _contender(e, folder, x, dy, torch)
    exact = _reference(e, x, dy, folder, torch).cpu()
    with harness.device_lock().timing():  # cuDNN's first call searches its algorithms by timing them
        r = call()
        sync(r)
    got = as_torch(r).cpu().double()
    rec.update(harness.check(got, exact, e["dw_dtype"], torch, rms=False))
    del got, exact
    # The single calls and the back-to-back stream in one session, told apart by the pauses (harness.calls).
    (kernels, rec["launch"]), wall = harness.profile_calls(
        call, sync, torch, harness.activities(torch, DEVICE), SINGLE_REPS, SUSTAINED_CALLS,
        lambda trace: (kernel_events(trace), _launch_facts(trace)))  # fmt: skip
    calls = [sum(dur for _, dur, _ in c) for c in harness.calls(kernels, 4000.0)]
    per_call, stream = calls[:SINGLE_REPS], calls[SINGLE_REPS:]
    rec["kernels"] = sorted({k for _, _, k in kernels})[:4]
    rec["kernels_per_call"] = len(kernels) / (SINGLE_REPS + SUSTAINED_CALLS)
    rec["single_us"] = statistics.median(per_call) if per_call else None
    rec["sustained_us"] = sum(stream) / SUSTAINED_CALLS if stream else None
    rec["sustained_wall_us"] = wall * 1e6
    rec["single_tflops"] = harness.tflops(e["flops"], rec["single_us"])
    return rec


def run_children(folder: Path, names: list[str]) -> None:
    """The child: set-up outside the GPU lock, then each contender checked and timed under it."""
    import torch

    if DEVICE == "cuda":  # CUPTI's first start costs seconds: pay it before timing (a context, a kernel: shared)
        with harness.device_lock().shared(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    entries = {e["name"]: e for e in harness.load_manifest(folder)["entries"]}
    for name in names:
        e = entries[name]
        t0 = time.time()
        try:
            x, dy = _inputs(e, torch)
            with harness.device_lock().shared():  # the copies to the device too: never beside another's timing
                x, dy = x.to(DEVICE), dy.to(DEVICE)
                rec = _measure(e, folder, x, dy, torch)
            del x, dy
        except Exception as exc:  # one problem's failure (e.g. cuDNN out of memory) is that problem's row
            rec = {"name": name, "kind": e["kind"], "problem": e["problem"], "error": f"{type(exc).__name__}: {exc}"}
        rec["child_s"] = round(time.time() - t0, 2)
        print(json.dumps(rec), flush=True)
        if DEVICE == "cuda":
            with harness.device_lock().shared():  # freeing device memory is GPU work too
                torch.cuda.empty_cache()


# -- run side: the parent -------------------------------------------------------------------------------
def run_all(folder: Path, out: Path, budget: float, jobs: int, only: list[str] | None = None) -> int:
    """Every contender in a child (cuDNN's all in one), ``jobs`` children at once, within ``budget`` s."""
    start = time.time()
    manifest = harness.load_manifest(folder)
    entries = [e for e in manifest["entries"] if not only or any(o in e["name"] for o in only)]
    # cuDNN's child first (it walks every problem); ours before the product's: ours is what is measured.
    batches = [[e["name"] for e in entries if e["kind"] == "cudnn"]]
    # The recipe tiling (alt) shares its problem's child with ours, after it: a fault there loses no row of ours.
    alt = {e["problem"] for e in entries if e["kind"] == "alt"}
    batches += [[e["name"], *([f"alt:{e['problem']}"] if e["problem"] in alt else [])]
                for e in entries if e["kind"] == "ours"]  # fmt: skip
    batches += [[e["name"]] for e in entries if e["kind"] in ("gather", "fold", "merged", "merged_full", "product")]
    rows = harness.run_batches(__file__, folder, out, [b for b in batches if b], budget, jobs, start)
    return report(rows, manifest, out, harness.device_name(DEVICE), wall=time.time() - start)


def report(rows: list[dict], manifest: dict, out: Path, device: str, date: str | None = None,
           wall: float | None = None) -> int:  # fmt: skip
    """Write OUT/explicit_conv.json and .md: per problem ours, cuDNN, the product's default, the ratios."""
    by = harness.rows_by_problem(rows)
    plans = {e["problem"]: harness.plan_of(e["plan"]) for e in manifest["entries"] if e["kind"] == "ours"}
    product_plans = {e["problem"]: harness.plan_of(e["plan"]) for e in manifest["entries"] if e["kind"] == "product"}
    suite = {e["problem"]: e["suite"] for e in manifest["entries"]}
    f = harness.cell
    types = ", ".join(sorted({e.get("dtype", "f16") for e in manifest["entries"]}))
    l4 = manifest.get("layout") == 4  # the gathered layout-4 kernel's column; alt is the relayout asked for
    layout = "layout 4 (NGCHW/GKCYX/NGKHW)" if l4 else "layout 2 (NHWGC/GKYXC/NHWGK)"
    alt_name = "alt us (relayout asked)" if l4 else "alt us (128x256; depthwise: wide)"
    gathered_head = " gathered us | gathered / ours | folded us | folded / ours |" * l4
    lines = [f"# Explicit kernel, {layout}, {types}: {device}, {date or harness.now()}", "",
             "Kernel time a call by CUPTI (median of single calls 10 ms apart; sustained: back to back; ours and "
             "alt in layout 4: the transposes' kernels included).", "",
             f"| problem | tile, split | ours us | ok (max rel err) | sustained us | {alt_name} | cuDNN us | "
             f"product us (its plan) | cuDNN / ours | product / ours | ours TFLOP/s |{gathered_head}",
             f"|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|{'---:|---:|---:|---:|' * l4}"]  # fmt: skip
    vs_cudnn, vs_cudnn_all, vs_product, vs_gather, vs_fold = [], [], [], [], []
    for name in sorted(by, key=lambda n: list(suite).index(n) if n in suite else 0):
        k = by[name]
        ours, cudnn, prod, alt_ = k.get("ours", {}), k.get("cudnn", {}), k.get("product", {}), k.get("alt", {})
        plan = plans.get(name)
        tile = "-"
        if plan and plan.tile:
            tile = harness.tile_split(plan, k=True)
        elif plan and plan.depthwise:
            d = plan.depthwise
            tile = f"depthwise {d.channels}ch x{d.vector}, {d.taps} taps, {d.rows} lanes, {d.chunks} chunks"
        pp = product_plans.get(name)
        product_kind = (pp.strategy.value if pp else "-") + ("+depthwise" if pp and pp.depthwise else "")
        status = next((f"{key}" for key in ("crashed", "skipped", "error") if key in ours), None)
        ok = status or ("yes" if ours.get("correct") else "WRONG" if ours else "-")
        if ours.get("max_rel_err") is not None:
            ok += f" ({ours['max_rel_err']:.1e})"
        a, b = None, None
        if ours.get("correct") and ours.get("single_us"):
            if cudnn.get("single_us"):
                a = cudnn["single_us"] / ours["single_us"]
                vs_cudnn_all.append(a)
                if suite.get(name):
                    vs_cudnn.append(a)
            if prod.get("single_us") and prod.get("correct"):
                b = prod["single_us"] / ours["single_us"]
                vs_product.append(b)
        recipe = alt_.get("single_us") if alt_.get("correct") else None
        gathered = ""
        if l4:
            if plan and plan.get("channels_last"):
                tile += ", relayout"
            for kind, ratios in (("gather", vs_gather), ("fold", vs_fold)):
                k_us = k.get(kind, {}).get("single_us") if k.get(kind, {}).get("correct") else None
                ratio = k_us / ours["single_us"] if k_us and ours.get("correct") and ours.get("single_us") else None
                if ratio:
                    ratios.append(ratio)
                status = next((key for key in ("crashed", "skipped", "error") if key in k.get(kind, {})), None)
                wrong = "WRONG" if k.get(kind) and k[kind].get("correct") is False else None
                gathered += f" {wrong or status or f(k_us)} | {f(ratio, '{:.2f}')} |"
        lines.append(f"| {name} | {tile} | {f(ours.get('single_us'))} | {ok} | {f(ours.get('sustained_us'))} | "
                     f"{f(recipe)} | {f(cudnn.get('single_us'))} | {f(prod.get('single_us'))} ({product_kind}) | "
                     f"{f(a, '{:.2f}')} | {f(b, '{:.2f}')} | {f(ours.get('single_tflops'))} |{gathered}")  # fmt: skip
    doc = {
        "device": device,
        "date": date or harness.now(),
        "wall_s": wall,
        "geomean_cudnn_over_ours_suite": harness.geomean(vs_cudnn),
        "suite_problems_timed": len(vs_cudnn),
        "geomean_cudnn_over_ours_all": harness.geomean(vs_cudnn_all),
        "geomean_product_over_ours": harness.geomean(vs_product),
        "product_problems_timed": len(vs_product),
        "geomean_gather_over_ours": harness.geomean(vs_gather),
        "gather_problems_timed": len(vs_gather),
        "geomean_fold_over_ours": harness.geomean(vs_fold),
        "fold_problems_timed": len(vs_fold),
        "rows": rows,
        "refused": manifest["refused"],
    }
    suite_geo, all_geo = doc["geomean_cudnn_over_ours_suite"], doc["geomean_cudnn_over_ours_all"]
    lines += ["", f"Geomean cuDNN / ours over {len(vs_cudnn)} dense suite problems: {f(suite_geo, '{:.3f}')} "
              f"(with the ResNet-50 layers, {len(vs_cudnn_all)}: {f(all_geo, '{:.3f}')}); "
              f"product / ours over {len(vs_product)}: {f(doc['geomean_product_over_ours'], '{:.2f}')}"
              + (f"; gathered / ours over {len(vs_gather)}: {f(doc['geomean_gather_over_ours'], '{:.2f}')}, "
                 f"folded / ours over {len(vs_fold)}: {f(doc['geomean_fold_over_ours'], '{:.2f}')}") * l4
              + ".", ""]  # fmt: skip
    lines += _thin_lines(by, manifest)
    lines += harness.notes(manifest, rows, wall)
    return harness.write_tables(out, "explicit_conv", doc, lines)


def _thin_lines(by: dict[str, dict], manifest: dict) -> list[str]:
    """``--thin``: the three forms of ours side by side (merged groups, the grouped depthwise form, one group a
    GEMM), cuDNN, and the merged form's ratios; nothing for a manifest without merged entries."""
    merged = {e["problem"]: harness.plan_of(e["plan"]) for e in manifest["entries"] if e["kind"] == "merged"}
    if not merged:
        return []
    f = harness.cell
    lines = ["## Thin groups: the three forms of ours", "",
             "| problem | merged: groups, tile, split | merged us | ok | every MMA tile us | grouped form us | "
             "one group a GEMM us | cuDNN us | cuDNN / merged | one group / merged | grouped / merged |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, plan in merged.items():
        k = by.get(name, {})
        row = {kind: k.get(kind, {}) for kind in ("merged", "merged_full", "ours", "alt", "cudnn")}
        us = {kind: r.get("single_us") if r.get("correct", kind == "cudnn") else None for kind, r in row.items()}
        what = f"{plan.merge.groups}, {harness.tile_split(plan, k=True)}"
        status = next((key for key in ("crashed", "skipped", "error") if key in row["merged"]), None)
        ok = status or ("yes" if row["merged"].get("correct") else "WRONG" if row["merged"] else "-")
        ratio = {kind: f(us[kind] / us["merged"] if us[kind] and us["merged"] else None, "{:.2f}") for kind in us}
        lines.append(f"| {name} | {what} | {f(us['merged'])} | {ok} | {f(us['merged_full'])} | {f(us['ours'])} | "
                     f"{f(us['alt'])} | "
                     f"{f(us['cudnn'])} | {ratio['cudnn']} | {ratio['alt']} | {ratio['ours']} |")  # fmt: skip
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    ap, sub, run = harness.command_line(__file__, __doc__, "host kernels of a few small problems (CPU rehearsal)",
                                        only=True)  # fmt: skip
    compile_parser = sub.choices["compile"]
    compile_parser.add_argument("--ranks", nargs="+", type=int, choices=(1, 2, 3), default=[2],
                                help="spatial ranks of the suite problems (default 2)")  # fmt: skip
    compile_parser.add_argument("--types", nargs="+", choices=TYPES, default=["f16"],
                                help="input types, each problem in each (default f16)")  # fmt: skip
    compile_parser.add_argument("--depthwise", action="store_true",
                                help="the depthwise layers instead of the dense ones")  # fmt: skip
    compile_parser.add_argument("--thin", action="store_true",
                                help="the thin-group layers (the grouped form) instead of the dense ones")  # fmt: skip
    compile_parser.add_argument("--layout4", action="store_true",
                                help="layout-4 problems (torch's NCHW): ours, the gathered kernel, the product's "
                                     "former choice")  # fmt: skip
    harness.add_batch_options(run, budget=150.0)
    run.add_argument("--only", nargs="*", help="only the contenders whose name holds one of these")
    harness.add_child_parser(sub, "run-one")
    return harness.main(ap, argv, compile=lambda a: compile_all(a.dir, a.smoke, a.only, tuple(a.ranks), tuple(a.types),
                                                                  a.depthwise, a.thin, a.layout4),
                        run=lambda a: run_all(a.dir, a.out, a.budget, a.jobs, a.only), report=report,
                        children={"run-one": lambda a: run_children(a.dir, a.names)})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
