"""Issue 24 item 3: the sm_90a weight gradient (convbw_mlir/kernels/conv_sm90.py: TMA im2col, MN-major wgmma,
warp-specialized) against cuDNN and our sm_80 explicit kernel, layout 2 (channels-last), kernel time by CUPTI.

Compile here (needs the IREE compiler), run there (needs torch and iree-base-runtime):

    .venv/bin/python bench/hopper_conv.py compile DIR [--only NAME ...] [--ranks]
    python3 hopper_conv.py run DIR --out OUT --budget 200              # on the GPU machine

``--ranks``: the 1-D and 3-D layers of :data:`RANKED` instead (and two in layout 4), ours through the product
(``compile_op(p, "sm_90a")``'s artifact by the direct launch; :func:`compile_ranked`), 1-D cuDNN as the product's
runner poses it (2-D, H = 1, channels_last: :func:`_cudnn_1d`); bench/results/h200_2026-11-26_hopper_rank.

Problems: the dense 2-D problems of bench/explicit_conv.py (the suites' G=1 layers and ResNet-50's 3x3 and
1x1 layers) of at least 4 GFLOP, in f16, and the three largest again in bf16 (dW in the input type).
``compile`` writes per problem our sm_90a kernel's PTX and launch (``sm90_<problem>.ptx``: its tile width and split
by ``convbw_mlir.policies.sm90.choose``) and our sm_80 explicit kernel's vmfb (``sm80_<problem>.vmfb``:
``compile_op(strategy="explicit")`` for sm_80, as bench/explicit_conv.py builds it), and the manifest.

``run`` runs one child per problem (cuDNN, then sm_80, then ours: a fault in ours loses no baseline), children
``--jobs`` at once, their GPU work under the GPU's machine-wide lock (``harness.device_lock``: timing alone). Ours: the
launcher encodes dy's tiled map and x's im2col map (``cuTensorMapEncodeTiled`` / ``cuTensorMapEncodeIm2col``,
128-byte swizzle, zero fill) on inputs that are followed by NaN (an over-read shows), dW (or the split
partials) poisoned with NaN before each check; a split's stage 2 is ``torch.sum`` of the f32 partials and its
kernels count in the time. Every result is checked against float64 (explicit_conv's cached reference), then
timed as explicit_conv.py does (``single``: median kernel time of calls 10 ms apart). Writes
``OUT/hopper_conv.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import explicit_conv as ec  # bench/explicit_conv.py: problems, inputs, reference, cuDNN and IREE contenders
import harness

MIN_FLOPS = 4e9
BF16 = ("large_3x3_256_n64_56", "resnet50_3x3_256_n256_14", "retina_k2376_100")
FENCE_ELEMENTS = 1 << 19
KINDS = ("cudnn", "sm80", "sm90", "variant", "product")
# ``compile --ranks``: the 1-D and 3-D layers of the classes suite (convbw_mlir/suites/classes.tsv) the sm_90a kernel
# takes (C a multiple of 64), f16 and bf16, through the product (``compile_op(p, "sm_90a")``: the plan, the tensor-map
# record, the direct launch's encoding); two also in layout 4 (NCHW: the plan's relayouted copies), f16
RANKED = ("conv1d_wav2vec2_conv1", "conv1d_whisper_base_conv2", "conv1d_tcn_d4", "conv3d_r3d18_layer1",
          "conv3d_r3d18_layer3_s2", "conv3d_r2plus1d_spatial", "conv3d_i3d_1x1x1_192")  # fmt: skip
RANKED_LAYOUT4 = ("conv3d_r3d18_layer1", "conv1d_whisper_base_conv2")


# -- compile side ------------------------------------------------------------------------------------
def problems() -> dict[str, Any]:
    from convbw_mlir.policies import sm90

    out = {}
    for t in ("f16", "bf16"):
        for name, p in ec.problems(types=(t,)).items():
            if sm90.flops(p) >= MIN_FLOPS and (t == "f16" or name.removesuffix("_bf16") in BF16):
                out[name] = p
    return out


def ranked_problems() -> dict[str, Any]:
    """:data:`RANKED` in f16 and bf16 (``_bf16``), and :data:`RANKED_LAYOUT4` in layout 4 (``_layout4``)."""
    from convbw_mlir.suites import load_suite

    out = {}
    for t in ("f16", "bf16"):
        for name, p in load_suite("classes", dtype=t):
            if name in RANKED:
                out[name if t == "f16" else f"{name}_bf16"] = p
            if name in RANKED_LAYOUT4 and t == "f16":
                out[f"{name}_layout4"] = p.with_(layout=4)  # no dot: the run's log names drop a suffix
    return out


def compile_ranked(folder: Path, only: list[str] | None, every: bool = False) -> None:
    """Per problem: cuDNN's entry, our sm_80 plan's vmfb (``compile_op(p, "sm_80")``: its explicit kernel in layout
    2, the plan's own choice in layout 4) and the product's sm_90a artifact (``product_<problem>/``); ``every``
    (``--product``): the suite's, the held-out and the ranked layers, all through the product."""
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    chosen = {**problems(), **held_out(), **ranked_problems()} if every else ranked_problems()
    for name, p in chosen.items():
        if only and not any(o in name for o in only):
            continue
        t0 = time.time()
        layout = 4 if name.endswith("_layout4") else 2
        base = {"problem": name, "suite": True, **harness.problem_fields(p), "dtype": p.dtype, "layout": layout,
                "ranked": True}  # fmt: skip
        entries.append({**base, "name": f"cudnn:{name}", "kind": "cudnn", "vmfb": None})
        for kind, target, options in (("sm80", "sm_80", {} if layout == 4 else {"strategy": "explicit"}),
                                      ("product", "sm_90a", {"output_arg": True})):  # fmt: skip
            try:
                op = compile_op(p, target, isolate=True, cache=False, **options)
            except (PlanError, CompileError) as e:
                refused[f"{kind}:{name}"] = str(e)
                continue
            if kind == "sm80":
                (folder / f"sm80_{name}.vmfb").write_bytes(op.vmfb)
                where = {"vmfb": f"sm80_{name}.vmfb"}
            else:
                op.save(folder / f"product_{name}")
                where = {"artifact": f"product_{name}", "maps": len(op.launch.tensor_maps)}
            entries.append({**base, "name": f"{kind}:{name}", "kind": kind, "plan": op.plan.to_dict(), **where})
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    harness.write_manifest(folder, {"target": "sm_90a", "entries": entries, "refused": refused, "seed": ec.SEED})


# Variants beside the rule's choice (``compile --variants``): (splits, bn, persistent workgroups, StreamK
# workgroups, consumer warpgroups) per problem. Run 1 gave every problem StreamK on 132 workgroups at bn 256
# and 192 (``--streamk``); run 2 the split rule's old choice where StreamK is now the rule's, and one
# consumer warpgroup (64-row tiles) or 64-column tiles where K or Y X C is 64.
VARIANTS: dict[str, list[tuple[int, ...]]] = {
    "retina_k2376_100": [(3, 256)],
    "retina_k2376_100_bf16": [(3, 256)],
    "retina_k2376_50": [(1, 192)],
    "resnet50_3x3_512_n256_7": [(3, 256)],
    "vgg16_3x3_512_n64_28": [(5, 256)],
    "resnet50_3x3_64_n256_56": [(44, 192, 0, 0, 1), (22, 192, 0, 0, 1), (32, 256, 0, 0, 1)],
    "resnet50_1x1_256to64_n256_56": [(128, 256, 0, 0, 1), (66, 256, 0, 0, 1)],
    "resnet50_1x1_64to256_n256_56_bf16": [(66, 64), (32, 64)],
}
STREAMK = [(1, 256, 0, 132), (1, 192, 0, 132)]
# Held-out layers (not among the 13; never used to fit the rule): ResNet-50 (torchvision v1.5) and VGG-16
# 2-D layers at the batch sizes training runs them, in CK's line format (layout 2).
HELD_OUT = {
    "resnet50_3x3_64_n256_56": ("2 1 256 64 64 3 3 56 56 1 1 1 1 1 1 1 1", "f16"),
    "resnet50_3x3_128_n256_28_bf16": ("2 1 256 128 128 3 3 28 28 1 1 1 1 1 1 1 1", "bf16"),
    "resnet50_3x3_512_n256_7": ("2 1 256 512 512 3 3 7 7 1 1 1 1 1 1 1 1", "f16"),
    "resnet50_3x3_128_s2_n256_56_bf16": ("2 1 256 128 128 3 3 56 56 2 2 1 1 1 1 1 1", "bf16"),
    "resnet50_1x1_256to64_n256_56": ("2 1 256 64 256 1 1 56 56 1 1 1 1 0 0 0 0", "f16"),
    "resnet50_1x1_64to256_n256_56_bf16": ("2 1 256 256 64 1 1 56 56 1 1 1 1 0 0 0 0", "bf16"),
    "vgg16_3x3_512_n64_28": ("2 1 64 512 512 3 3 28 28 1 1 1 1 1 1 1 1", "f16"),
    "vgg16_3x3_128_n64_112_bf16": ("2 1 64 128 128 3 3 112 112 1 1 1 1 1 1 1 1", "bf16"),
}


# Run 3: fresh held-out layers for the narrow-tile rule (fitted on run 2's three K = 64 / C = 64 layers above),
# each with the split rule's old choice beside it (VARIANTS_NARROW).
HELD_OUT_NARROW = {
    "resnet18_3x3_64_n128_56": ("2 1 128 64 64 3 3 56 56 1 1 1 1 1 1 1 1", "f16"),
    "resnet50_1x1_64to64_n256_56_bf16": ("2 1 256 64 64 1 1 56 56 1 1 1 1 0 0 0 0", "bf16"),
    "resnet50_1x1_64to256_n128_56": ("2 1 128 256 64 1 1 56 56 1 1 1 1 0 0 0 0", "f16"),
    "resnet50_1x1_256to64_n128_56_bf16": ("2 1 128 64 256 1 1 56 56 1 1 1 1 0 0 0 0", "bf16"),
}
VARIANTS_NARROW = {
    "resnet18_3x3_64_n128_56": [(26, 128)],
    "resnet50_1x1_64to64_n256_56_bf16": [(32, 128)],
    "resnet50_1x1_64to256_n128_56": [(32, 128)],
    "resnet50_1x1_256to64_n128_56_bf16": [(32, 128)],
    "resnet50_3x3_64_n256_56": [(26, 128)],
    "resnet50_1x1_256to64_n256_56": [(32, 128)],
    "resnet50_1x1_64to256_n256_56_bf16": [(32, 128)],
}


def held_out() -> dict[str, Any]:
    from convbw_mlir.problem import ConvBwdWeightProblem as P

    return {
        name: P.from_ck(line).with_(dtype=t, dw_dtype=t) for name, (line, t) in {**HELD_OUT, **HELD_OUT_NARROW}.items()
    }


def geometry(p: Any, splits: int | None = None, bn: int | None = None, persistent: int = 0, streamk: int = 0,
             consumers: int = 2, fused: bool = False) -> Any:  # fmt: skip
    """The sm_90a kernel's numbers for problem ``p`` (its split by the policy's rule unless given)."""
    from convbw_mlir.kernels.conv_sm90 import ConvSm90
    from convbw_mlir.kernels.gemm_sm90 import Sm90Tiling
    from convbw_mlir.policies import sm90

    (h, w), (ho, wo), (fy, fx) = p.input_size, p.output_size, p.filter_size
    if splits is None:
        bn, splits, streamk = sm90.choose(p.out_channels, p.in_channels * fy * fx, p.batch * ho * wo, groups=p.groups)
        consumers = sm90.consumers_for(p.out_channels)
    tiling = Sm90Tiling(bn=bn or sm90.BN, persistent=persistent, consumers=consumers)
    return ConvSm90(p.batch, h, w, p.in_channels, p.out_channels, fy, fx, ho, wo, tuple(p.stride),
                    tuple(p.dilation), tuple(p.pad_low), tiling, splits, p.groups, streamk=streamk,
                    fused=fused)  # fmt: skip


def compile_sm90(p: Any, folder: Path, name: str, splits: int | None = None, bn: int | None = None,
                 persistent: int = 0, streamk: int = 0, consumers: int = 2,
                 fused: bool = False) -> dict[str, Any]:  # fmt: skip
    from convbw_mlir.build.cuda_schedule import read_cuda_executable
    from convbw_mlir.build.iree import compile_module
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.kernels.conv_sm90 import conv_module

    g = geometry(p, splits, bn, persistent, streamk, consumers, fused)
    with new_context(), ir.Location.unknown():
        text = str(conv_module(g, p.dtype, p.dw_dtype))
    hal = compile_module(text, "sm_90a", ["--compile-to=hal"])
    with new_context() as ctx:
        parsed = ir.Module.parse(hal, ctx)
        (binary,) = [o for o in _walk(parsed.operation) if o.name == "hal.executable.binary"]
        data = bytes(memoryview(ir.DenseIntElementsAttr(binary.attributes["data"])).cast("B"))
    (export,), (ptx,) = read_cuda_executable(data)
    tag = _variant(g.splits, g.tiling.bn, persistent, streamk, consumers) + ("_fused" if fused else "")
    stem = f"sm90_{name}" if splits is None else f"sm90_{tag}_{name}"
    (folder / f"{stem}.ptx").write_bytes(ptx)
    lower, upper = g.corners()
    return {"kernel": export.name, "grid": list(g.grid), "block": list(export.block), "shared": export.shared_memory,
            "splits": g.splits, "bn": g.tiling.bn, "persistent": persistent, "lower": list(lower), "upper": list(upper),
            "ptx": f"{stem}.ptx", "streamk": g.streamk, "partials": g.sk_partials if g.streamk else None,
            "rows": g.tiling.bm, "fused": fused, "counters": g.counters if fused else None}  # fmt: skip


def _variant(splits: int, bn: int, persistent: int = 0, streamk: int = 0, consumers: int = 2) -> str:
    return (f"s{splits}_bn{bn}" + (f"_p{persistent}" if persistent else "") + (f"_sk{streamk}" if streamk else "")
            + (f"_c{consumers}" if consumers != 2 else ""))  # fmt: skip


def _walk(op: Any):
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _walk(inner.operation)


def compile_all(folder: Path, only: list[str] | None, variants: bool = False, sm80: bool = True,
                streamk: bool = False, narrow: bool = False, fused: bool = False) -> None:  # fmt: skip
    from convbw_mlir import compile_op
    from convbw_mlir.build.iree import CompileError
    from convbw_mlir.plan import PlanError
    from convbw_mlir.policies import sm90

    folder.mkdir(parents=True, exist_ok=True)
    entries, refused = [], {}
    suite, extra = problems(), held_out()
    for name, p in {**suite, **extra}.items():
        if only and not any(o in name for o in only):
            continue
        t0 = time.time()
        base = {"problem": name, "suite": name in suite, **harness.problem_fields(p), "dtype": p.dtype}
        entries.append({**base, "name": f"cudnn:{name}", "kind": "cudnn", "vmfb": None})
        try:
            if not sm80:
                raise PlanError("sm_80 not asked (compile --no-sm80)")
            op = compile_op(p, "sm_80", strategy="explicit", isolate=True, cache=False)
            (folder / f"sm80_{name}.vmfb").write_bytes(op.vmfb)
            entries.append({**base, "name": f"sm80:{name}", "kind": "sm80", "vmfb": f"sm80_{name}.vmfb",
                            "plan": op.plan.to_dict()})  # fmt: skip
        except (PlanError, CompileError) as e:
            refused[f"sm80:{name}"] = str(e)
        why = sm90.refusals(p)
        if why:
            refused[f"sm90:{name}"] = "; ".join(why)
        else:
            entries.append({**base, "name": f"sm90:{name}", "kind": "sm90", **compile_sm90(p, folder, name)})
            table = VARIANTS_NARROW if narrow else VARIANTS
            extra = table.get(name, []) if variants else []
            rule = geometry(p)
            if fused and rule.splits > 1:  # the rule's split with its second stage in the kernel
                extra = [*extra, (rule.splits, rule.tiling.bn, 0, 0, rule.tiling.consumers, True)]
            for splits, bn, *more in extra + (STREAMK if streamk else []):
                tag = _variant(splits, bn, *more[:3]) + ("_fused" if more[3:] and more[3] else "")
                entries.append({**base, "name": f"sm90_{tag}:{name}", "kind": "variant",
                                **compile_sm90(p, folder, name, splits, bn, *more)})  # fmt: skip
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    harness.write_manifest(folder, {"target": "sm_90a", "entries": entries, "refused": refused, "seed": ec.SEED,
                                    "layout": 2})  # fmt: skip


# -- run side: a child ---------------------------------------------------------------------------------
def _encode_maps(lib: Any, e: dict, dy: Any, x: Any) -> bytes:
    """dy's tiled map (2-D {K, N Ho Wo}, box {64, 64}) and x's im2col map ({C, W, H, N}, the bounding box
    corners of ConvSm90.corners, 64 channels x 64 pixels, traversal strides = the conv's), 128-byte swizzle,
    L2 promotion 256 B, out of bounds read as zero, by the product's encoder (``cuda_launch.encode_tensor_map``)."""
    from convbw_mlir.cuda_launch import TensorMap, encode_tensor_map

    dtype = {"f16": 6, "bf16": 9}[e["dtype"]]  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16
    n, (h, w), c, k = e["images"], e["input_size"], e["in_channels"], e["out_channels"]
    rows = n * math.prod(e["output_size"])
    sh, sw = e["stride"]
    common = {"kernel": "conv_sm90", "maps_binding": 2, "dtype": dtype}
    dy_map = TensorMap(binding=0, slot=0, mode="tiled", dims=(k, rows), strides=(k * 2,), box=(64, 64),
                       element_strides=(1, 1), **common)  # fmt: skip
    x_map = TensorMap(binding=1, slot=1, mode="im2col", dims=(c, w, h, n), strides=(2 * c, 2 * w * c, 2 * h * w * c),
                      box=(64, 64), element_strides=(1, sw, sh, 1), lower=e["lower"], upper=e["upper"],
                      **common)  # fmt: skip
    return encode_tensor_map(lib, dy_map, dy.data_ptr()) + encode_tensor_map(lib, x_map, x.data_ptr())


def _fenced(t: Any, torch: Any) -> Any:
    """``t`` on the GPU at the start of a buffer whose rest is NaN (an over-read shows in dW)."""
    buf = torch.full((t.numel() + FENCE_ELEMENTS,), float("nan"), dtype=t.dtype, device="cuda")
    buf[: t.numel()].copy_(t.reshape(-1))
    return buf[: t.numel()].view(t.shape)


def _sm90(e: dict, folder: Path, x: Any, dy: Any, torch: Any):
    """(call, as_torch, sync) of our sm_90a kernel, as explicit_conv's contenders."""
    from convbw_mlir.cuda_launch import CudaLauncher, Dispatch, ExportDef, Launch, _libcuda

    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[e["dtype"]]
    xs, dys = _fenced(x, torch), _fenced(dy, torch)
    maps = torch.frombuffer(bytearray(_encode_maps(_libcuda(), e, dys, xs)), dtype=torch.uint8).cuda()
    k, cols = e["out_channels"], e["in_channels"] * math.prod(e["filter_size"])
    splits = e["splits"]
    grp = e["groups"]
    c = torch.empty((splits, grp, k, cols) if splits > 1 else (grp, k, cols), device="cuda",
                    dtype=torch.float32 if splits > 1 else dt)  # fmt: skip
    work = []
    fused = bool(e.get("fused"))
    if fused:  # partials poisoned, counters zero (the kernel resets them), dW written by the kernel
        c = torch.empty((grp, k, cols), device="cuda", dtype=dt)
        work = [torch.full((splits, grp, k, cols), float("nan"), device="cuda"),
                torch.zeros(e["counters"], dtype=torch.int32, device="cuda")]  # fmt: skip
    if e.get("streamk"):  # partials poisoned (a read before its write shows), flags zero (the kernel resets them)
        work = [torch.full(e["partials"], float("nan"), device="cuda"),
                torch.zeros((e["streamk"], e["partials"][1]), dtype=torch.int32, device="cuda")]  # fmt: skip
    nb = 4 + len(work)
    export = ExportDef(e["kernel"], 0, tuple(e["block"]), e["shared"], 0, nb)
    binds = tuple((f"arg{i}", 0) for i in range(nb))
    launch = Launch("main", [Dispatch(e["kernel"], tuple(e["grid"]), binds)], 0, (0, 0, 0, 0),
                    {e["kernel"]: export}, [(folder / e["ptx"]).read_bytes()])  # fmt: skip
    launcher = CudaLauncher(launch, torch.cuda.current_device())
    ptrs = (dys.data_ptr(), xs.data_ptr(), maps.data_ptr(), *(w.data_ptr() for w in work), c.data_ptr())
    harness.KEEP.append((launcher, xs, dys, maps, c, work))
    first = [True]

    def call() -> Any:
        if first[0]:  # the checked call: every element of dW (or of the partials) must be written
            c.fill_(float("nan"))
            first[0] = False
        launcher(ptrs, torch.cuda.current_stream().cuda_stream)
        return c.sum(0).to(dt) if splits > 1 and not fused else c

    def as_torch(r: Any) -> Any:
        if work and work[1].any():  # a launch must leave StreamK's flags (the fused split's counters) as it found them
            raise RuntimeError(f"flags or counters left raised: {int(work[1].count_nonzero())}")
        return r.reshape(grp, k, *e["filter_size"], e["in_channels"])

    return call, as_torch, (lambda _r: torch.cuda.synchronize())


def _product(e: dict, folder: Path, x: Any, dy: Any, torch: Any):
    """(call, as_torch, sync) of the product's sm_90a artifact by the direct launch (its schedule: transposes,
    kernel, stage 2; the launcher encodes the recorded tensor maps), dW and the workspace poisoned with NaN."""
    from convbw_mlir.build.artifact import CompiledOp
    from convbw_mlir.cuda_launch import CudaLauncher

    launch = CompiledOp.load(folder / e["artifact"]).launch
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[e["dw_dtype"]]
    xs, dys = _fenced(x, torch), _fenced(dy, torch)
    grp, k, c, f = e["groups"], e["out_channels"], e["in_channels"], e["filter_size"]
    out = torch.empty(grp * k * c * math.prod(f), dtype=dt, device="cuda")
    ws = torch.empty(max(launch.transient, 256), dtype=torch.uint8, device="cuda")
    launcher = CudaLauncher(launch, torch.cuda.current_device())
    ptrs = (xs.data_ptr(), dys.data_ptr(), out.data_ptr(), ws.data_ptr())
    harness.KEEP.append((launcher, xs, dys, out, ws))
    first = [True]

    def call() -> Any:
        if first[0]:  # the checked call: dW and the partials start as NaN
            out.fill_(float("nan"))
            ws.fill_(255)  # all-ones bytes: NaN in f16, bf16 and f32
            first[0] = False
        launcher(ptrs, torch.cuda.current_stream().cuda_stream)
        return out

    def as_torch(r: Any) -> Any:  # GKYXC (layout 2) or GKCYX (layout 4), as explicit_conv's reference
        return r.reshape(grp, k, c, *f) if e.get("layout") == 4 else r.reshape(grp, k, *f, c)

    return call, as_torch, (lambda _r: torch.cuda.synchronize())


def _cudnn_1d(e: dict, x: Any, dy: Any, torch: Any):
    """(call, as_torch, sync) of cuDNN's 1-D weight gradient as the product's runner poses it
    (``convbw_mlir.measure.run``): a 2-D one with H = 1 on channels_last views of the NWC memory (torch's
    ``conv1d_weight`` on a permuted NWC view has no channels-last path: 4-5x slower on the H200)."""
    torch.backends.cudnn.benchmark = True
    xc, dyc = (t.unsqueeze(1).permute(0, 3, 1, 2) for t in (x, dy))  # [N, C, 1, W], channels_last strides
    (f,), (s,), (p,), (d,) = e["filter_size"], e["stride"], e["pad"], e["dilation"]
    shape = (e["groups"] * e["out_channels"], e["in_channels"], 1, f)

    def call() -> Any:
        return torch.nn.grad.conv2d_weight(xc, shape, dyc, stride=(1, s), padding=(0, p), dilation=(1, d),
                                           groups=e["groups"])  # fmt: skip

    return call, (lambda r: ec._as_gkyxc(e, r.squeeze(2))), (lambda _r: torch.cuda.synchronize())


def _contender(e: dict, folder: Path, x: Any, dy: Any, torch: Any):
    if e["kind"] == "cudnn" and e.get("ranked") and len(e["filter_size"]) == 1 and e.get("layout") != 4:
        return _cudnn_1d(e, x, dy, torch)
    if e["kind"] in ("sm90", "variant"):
        return _sm90(e, folder, x, dy, torch)
    if e["kind"] == "product":
        return _product(e, folder, x, dy, torch)
    return ec._contender(e, folder, x, dy, torch)


def _measure(e: dict, folder: Path, x: Any, dy: Any, torch: Any) -> dict[str, Any]:
    """Check one contender against float64 and time it (explicit_conv's measure, our contenders)."""
    from convbw_mlir.measure.cupti import kernel_events

    rec: dict[str, Any] = {"name": e["name"], "kind": e["kind"], "problem": e["problem"], "flops": e["flops"]}
    call, as_torch, sync = _contender(e, folder, x, dy, torch)
    exact = ec._reference(e, x, dy, folder, torch).cpu()
    with harness.device_lock().timing():  # cuDNN's first call searches its algorithms by timing them
        r = call()
        sync(r)
    got = as_torch(r).cpu().double()
    rec.update(harness.check(got, exact, e["dw_dtype"], torch, rms=False))
    del got, exact
    (kernels, rec["launch"]), _ = harness.profile_calls(
        call, sync, torch, harness.activities(torch, "cuda"), ec.SINGLE_REPS, ec.SUSTAINED_CALLS,
        lambda trace: (kernel_events(trace), ec._launch_facts(trace)))  # fmt: skip
    calls = [sum(dur for _, dur, _ in c) for c in harness.calls(kernels, 4000.0)]
    per_call, stream = calls[: ec.SINGLE_REPS], calls[ec.SINGLE_REPS :]
    rec["kernels"] = sorted({k for _, _, k in kernels})[:4]
    rec["single_us"] = statistics.median(per_call) if per_call else None
    rec["sustained_us"] = sum(stream) / ec.SUSTAINED_CALLS if stream else None
    rec["single_tflops"] = harness.tflops(e["flops"], rec["single_us"])
    return rec


def run_children(folder: Path, names: list[str]) -> None:
    import torch

    with harness.device_lock().shared(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    entries = {e["name"]: e for e in harness.load_manifest(folder)["entries"]}
    for name in names:
        e = entries[name]
        t0 = time.time()
        try:
            x, dy = ec._inputs(e, torch)
            with harness.device_lock().shared():  # GPU work; the timing in _measure holds the GPU alone
                x, dy = x.to("cuda"), dy.to("cuda")
                rec = _measure(e, folder, x, dy, torch)
            del x, dy
        except Exception as exc:  # one contender's failure is its row
            rec = {"name": name, "kind": e["kind"], "problem": e["problem"], "error": f"{type(exc).__name__}: {exc}"}
        rec["child_s"] = round(time.time() - t0, 2)
        print(json.dumps(rec), flush=True)
        with harness.device_lock().shared():
            torch.cuda.empty_cache()


# -- run side: the parent -------------------------------------------------------------------------------
def run_all(folder: Path, out: Path, budget: float, jobs: int) -> int:
    start = time.time()
    manifest = harness.load_manifest(folder)
    by_problem: dict[str, list[str]] = {}
    for e in sorted(manifest["entries"], key=lambda e: KINDS.index(e["kind"])):
        by_problem.setdefault(e["problem"], []).append(e["name"])
    rows = harness.run_batches(__file__, folder, out, list(by_problem.values()), budget, jobs, start, 60.0)
    return report(rows, manifest, out, harness.device_name("cuda"), wall=time.time() - start)


def report(rows: list[dict], manifest: dict, out: Path, device: str, wall: float | None = None) -> int:
    got = harness.rows_by_problem(rows)
    head = ("| problem | GFLOP | tile, splits | ours sm_90a us | TFLOP/s | cuDNN us | sm_80 us | vs cuDNN | vs sm_80 | "
            "correct (ours, cuDNN, sm_80) |")  # fmt: skip
    lines = [f"# sm_90a weight gradient, layout 2: {device}, {harness.now()}", "", head, "|" + "---|" * 10]
    ratios, ratios_big, vs80, held = [], [], [], []
    suite = {e["problem"]: e.get("suite", True) for e in manifest["entries"]}
    splits = {e["problem"]: f"{e.get('rows', 128)}x{e.get('bn')}, "
              + (f"SK {e['streamk']}" if e.get("streamk") else str(e["splits"]))
              for e in manifest["entries"] if e["kind"] == "sm90"}  # fmt: skip
    splits.update({e["problem"]: _plan_cell(harness.plan_of(e["plan"])) for e in manifest["entries"]
                   if e["kind"] == "product"})  # fmt: skip
    for problem, r in got.items():
        ours, cud, s80 = (r.get(k, {}) for k in ("sm90" if "sm90" in r else "product", "cudnn", "sm80"))
        t, tc, t8 = ours.get("single_us"), cud.get("single_us"), s80.get("single_us")
        ok = ours.get("correct")
        q = tc / t if t and tc and ok else None
        q8 = t8 / t if t and t8 and ok else None
        in_suite = suite.get(problem, True)
        if q:
            (ratios if in_suite else held).append(q)
        if q8:
            vs80.append(q8)
        label = problem if in_suite else f"{problem} (held out)"
        flops = (ours or cud).get("flops", 0)
        lines.append(f"| {label} | {flops / 1e9:.1f} | {splits.get(problem, '-')} | " + " | ".join(
            harness.cells({"a": t, "b": ours.get("single_tflops"), "c": tc, "d": t8, "e": q, "f": q8},
                          "a", "b", "c", "d", "e:.2f", "f:.2f"))
            + " | " + ", ".join(str(x.get("correct", x.get("error", x.get("crashed", "-"))))[:40]
                                for x in (ours, cud, s80)) + " |")  # fmt: skip
        if in_suite:
            ratios_big.append(q)
    gm, gm80 = harness.geomean(ratios), harness.geomean(vs80)
    lines += ["", f"Geomean vs cuDNN: {harness.cell(gm, '{:.2f}')}x over {len(ratios)} problems; vs our sm_80 kernel: "
              f"{harness.cell(gm80, '{:.2f}')}x. Problems >= 0.9x cuDNN: {sum(1 for q in ratios if q >= 0.9)} of "
              f"{len(ratios_big)}. Held-out layers: geomean {harness.cell(harness.geomean(held), '{:.2f}')}x over "
              f"{len(held)} (counted apart from the suite's).", ""]  # fmt: skip
    variants = [r for r in rows if r.get("kind") == "variant"]
    if variants:
        lines += ["Variants beside the rule's split and tile (single-call kernel time, us):", "",
                  "| variant | us | rule's us | correct |", "|---|---|---|---|"]  # fmt: skip
        for r in variants:
            rule = got.get(r["problem"], {}).get("sm90", {}).get("single_us")
            lines.append(f"| {r['name']} | {harness.cell(r.get('single_us'))} | {harness.cell(rule)} | "
                         f"{r.get('correct', r.get('error', r.get('crashed')))} |")  # fmt: skip
        lines.append("")
    lines += harness.notes(manifest, rows, wall, wrong=True)
    doc = {"device": device, "date": harness.now(), "rows": rows, "geomean_vs_cudnn": gm, "geomean_vs_sm80": gm80}
    return harness.write_tables(out, "hopper_conv", doc, lines)


def _plan_cell(plan: Any) -> str:
    """A product plan (a ``Plan``) as the table shows it: the tile's M x N and the split (sm_80 kernels: their
    intrinsic; a plan without a tile: its strategy)."""
    t = plan.tile
    kind = "" if t and "WGMMA" in t.intrinsic else f" {t.intrinsic if t else plan.strategy.value}"
    m, n = (t.m, t.n) if t else (None, None)
    return f"{m}x{n}, {plan.k_batch}{kind}" + (", relayout" if plan.channels_last else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir", type=Path)
    c.add_argument("--only", nargs="*")
    c.add_argument("--variants", action="store_true", help="also the split and tile variants of VARIANTS")
    c.add_argument("--no-sm80", dest="sm80", action="store_false", help="skip our sm_80 kernel")
    c.add_argument("--ranks", action="store_true", help="the 1-D and 3-D layers of RANKED instead, through the product")
    c.add_argument("--product", action="store_true", help="the suite's, held-out and RANKED layers through the product")
    c.add_argument("--streamk", action="store_true", help="also StreamK variants (STREAMK) of every problem")
    c.add_argument("--narrow", action="store_true", help="--variants from VARIANTS_NARROW (run 3)")
    c.add_argument("--fused", action="store_true", help="also the rule's split with its stage 2 in the kernel")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget", type=float, default=200.0)
    r.add_argument("--jobs", type=int, default=1, help="children at once (default 1: one measuring process)")
    o = sub.add_parser("run-one")
    o.add_argument("dir", type=Path)
    o.add_argument("names", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        if a.ranks or a.product:
            compile_ranked(a.dir, a.only, a.product)
        else:
            compile_all(a.dir, a.only, a.variants, a.sm80, a.streamk, a.narrow, a.fused)
        return 0
    if a.cmd == "run":
        return run_all(a.dir, a.out, a.budget, a.jobs)
    run_children(a.dir, a.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
