"""Fenced GPU fuzz: random valid problems, every strategy the plan can choose, NaN after x and dy.

    python bench/fenced_fuzz.py compile --count 500 --seed 1 --out .art/fuzz      (here: needs the compiler)
    python bench/fenced_fuzz.py compile --sweep overread --out .art/sweep         (the over-read class, by name)
    python bench/fenced_fuzz.py compile --profile gemv --alternatives 1 --target sm_90a --count 240 --out .art/fz
                                                   (GEMV-like problems: the plan's choice and the GEMV kernel)
    python bench/fenced_fuzz.py compile --profile thin90 --target sm_90a --count 220 --out .art/t90
                                                   (the wgmma kernel's boxed form, thin and medium groups)
    python bench/fenced_fuzz.py compile --recheck M.json R.json --recheck-with '' --ours-only --out .art/re
                                                   (an earlier run's failing problems, the plan's choices now)
    python bench/fenced_fuzz.py run .art/fuzz --shards 8 --out fuzz.json          (GPU machine: runtime only)
    python bench/fenced_fuzz.py run .art/fuzz --server --out fuzz.json            (one process: the runner's server)
    python bench/fenced_fuzz.py report fuzz.json [more.json ...]                  (markdown, by strategy and class)

Each problem gets the plan's own choice (contender ``convbw``) and, for a part of them, one other choice
the plan can make when asked (``strategy=codegen``, a batch split, the rows split, ``grouped=mma``, ...); a
choice the plan refuses is recorded as refused. The run side is the benchmark's runner
(:func:`convbw_mlir.measure.run.run_manifest`, ``check_only``): each problem in its own child process, x and
dy each placed right before 1 MiB of NaN (a kernel that reads past them returns NaN), dW checked against the
numpy float64 reference and a float64 sample; nothing is timed. Shards run side by side on one GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script (its docstring says how)

from convbw_mlir.problem import ConvBwdWeightProblem

ROOT = Path(__file__).resolve().parent.parent
IREE_FORMS = ("reference", "iree_direct", "iree_torch", "iree_fusilli")
# Per rank: input extent range per spatial dimension (small: hundreds of problems compile in minutes).
_INPUT = {1: (6, 64), 2: (3, 20), 3: (3, 8)}
# (class, weight): G, C, K drawn per class; the classes of the "every class" issue.
_CLASSES = (("dense", 3), ("first", 1), ("thin", 2), ("depthwise", 2), ("grouped", 2))
_LAYOUTS = ("NHWGC/GKYXC/NHWGK", "GNCHW/GKCYX/GNKHW", "GNHWC/GKYXC/GNHWK", "NGCHW/GKYXC/NGKHW", "NGCHW/GKCYX/NGKHW")
# Other choices the plan makes when asked (one per problem, for a share of the problems).
_ALTERNATIVES = ("strategy=codegen", "k_batch=2", "k_batch=3", "k_batch=rows", "k_batch=N", "grouped=mma",
                 "reduction_innermost=true", "strategy=explicit")  # fmt: skip
# The explicit kernels' own choices (profile ``explicit``: 2-D, f16, channels-last or layout 4, wide channels).
# The choices a recheck adds by default: the GPU reference, IREE's direct form, and the plan's other forms.
RECHECK_ALTERNATIVES = ("reference", "iree_direct", "convbw:k_batch=1", "convbw:strategy=explicit",
                        "convbw:grouped=mma", "convbw:reduction_innermost=true")  # fmt: skip
_EXPLICIT_ALTERNATIVES = ("strategy=explicit&k_batch=4", "strategy=explicit&streamk=auto",
                          "strategy=explicit&streamk=auto&streamk_fixup=tree", "strategy=explicit&producers=4",
                          "strategy=explicit&producers=2", "strategy=explicit&tile_m=64&tile_n=64")  # fmt: skip


# The sm_90a kernel's other choices (profile ``hopper``): splits, StreamK, narrow and wide tiles, the sm_80 kernel.
_HOPPER_ALTERNATIVES = ("strategy=explicit&k_batch=2", "strategy=explicit&k_batch=3", "strategy=explicit&streamk=auto",
                        "strategy=explicit&streamk=4", "strategy=explicit&tile_n=128", "strategy=explicit&tile_n=256",
                        "strategy=explicit&tile_m=128", "strategy=codegen")  # fmt: skip


def _channels(r: random.Random, cls: str) -> tuple[int, int, int]:
    """(G, C, K) of a problem of class ``cls``."""
    if cls == "dense":
        return 1, r.choice((8, 16, 24, 32, 48, 64)), r.choice((8, 16, 32, 36, 64))
    if cls == "first":
        return 1, r.choice((1, 2, 3, 4)), r.choice((8, 16, 24, 32))
    if cls == "thin":
        return r.choice((2, 4, 8, 16)), r.choice((1, 2, 3, 4, 5, 6)), r.choice((1, 2, 3, 4, 5, 8))
    if cls == "depthwise":
        return r.choice((3, 8, 16, 32, 64)), 1, r.choice((1, 1, 2))
    return r.choice((2, 3, 4, 8)), r.choice((8, 16, 32)), r.choice((8, 16, 32))


def random_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a valid problem) drawn from ``r``; invalid draws (no output position) are drawn again."""
    while True:
        cls = r.choices([c for c, _ in _CLASSES], [w for _, w in _CLASSES])[0]
        rank = r.choices((1, 2, 3), (3, 5, 2))[0]
        g, c, k = _channels(r, cls)
        lo, hi = _INPUT[rank]
        size = r.randint(lo, hi)
        inputs = tuple(size if r.random() < 0.7 else r.randint(lo, hi) for _ in range(rank))
        f = r.choice((1, 1, 2, 3, 3, 4, 5, 7) if rank < 3 else (1, 2, 3, 3))
        filt = tuple(f for _ in range(rank))
        stride = tuple(r.choice((1, 1, 1, 2, 3)) for _ in range(rank))
        dilation = tuple(r.choice((1, 1, 1, 1, 2, 3)) for _ in range(rank))
        pad_low = tuple(r.randint(0, f) if r.random() < 0.6 else 0 for _ in range(rank))
        pad_high = tuple(p if r.random() < 0.7 else r.randint(0, f) for p in pad_low)
        dtype = r.choices(("f16", "bf16", "f32"), (6, 3, 1))[0]
        dw_dtype = dtype if r.random() < 0.8 else "f32"
        layouts = _LAYOUTS + (("torch", "channels_last") if g == 1 else ())
        layout = _LAYOUTS[0] if r.random() < 0.6 else r.choice(layouts)
        try:
            p = ConvBwdWeightProblem(
                groups=g, batch=r.choice((1, 2, 3, 4, 5, 8, 16, 32)), in_channels=c, out_channels=k,
                input_size=inputs, filter_size=filt, stride=stride, dilation=dilation, pad_low=pad_low,
                pad_high=pad_high, dtype=dtype, dw_dtype=dw_dtype, layout=layout,
            )  # fmt: skip
        except ValueError:
            continue
        if p.flops <= 4e9:  # the numpy float64 reference checks every entry in well under a second
            return cls, p


def _options(alt: str, problem: ConvBwdWeightProblem) -> dict[str, Any]:
    """``a=b&c=d`` as plan options (``N``: the batch)."""
    options: dict[str, Any] = {}
    for pair in alt.split("&"):
        key, value = pair.split("=")
        if value in ("M", "S"):  # the boxed form's most groups a box; the fewest its box starts take (1 mostly)
            from convbw_mlir.policies import sm90

            most = sm90.merge_for(problem)
            options[key] = most if value == "M" else min(m for m in range(1, most + 1)
                                                         if not sm90.merge_misaligned(problem, m))  # fmt: skip
            continue
        options[key] = (
            problem.batch
            if value == "N"
            else True
            if value in ("true", "True")
            else int(value)
            if value.isdigit()
            else value
        )
    return options


def explicit_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a problem the explicit kernels take): 2-D, f16, layout 2 or 4, even channels, one or more groups."""
    while True:
        g = r.choice((1, 1, 1, 2, 4))
        size = r.randint(4, 24)
        f = r.choice((1, 3, 3, 5))
        try:
            p = ConvBwdWeightProblem(
                groups=g, batch=r.choice((1, 2, 4, 8, 16)), in_channels=r.choice((8, 16, 32, 64)),
                out_channels=r.choice((16, 32, 64, 128)), input_size=(size, r.choice((size, r.randint(4, 24)))),
                filter_size=(f, f), stride=r.choice((1, 1, 2)), dilation=r.choice((1, 1, 2)),
                pad_low=r.randint(0, f // 2 + 1), pad_high=r.randint(0, f // 2 + 1), dtype="f16",
                layout=r.choice((_LAYOUTS[0], _LAYOUTS[0], _LAYOUTS[4])),
            )  # fmt: skip
        except ValueError:
            continue
        return "explicit", p


def hopper_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a problem the sm_90a kernel takes or nearly does): 1- to 3-D, f16/bf16, C a multiple of 64, any K
    a multiple of 8, layouts 2, 4 and 0, sometimes the scale epilogue (its second pass)."""
    from convbw_mlir.problem import Epilogue

    while True:
        rank = r.choices((1, 2, 3), (2, 5, 2))[0]
        size = r.randint(*{1: (8, 96), 2: (4, 24), 3: (3, 8)}[rank])
        f = r.choice((1, 3, 3, 5) if rank < 3 else (1, 3))
        dtype = r.choice(("f16", "f16", "bf16"))
        ep = r.choice((None, None, None, Epilogue("scale", 0.5)))  # the runner's calls pass no D
        try:
            p = ConvBwdWeightProblem(
                groups=r.choice((1, 1, 1, 2)), batch=r.choice((1, 2, 4, 8, 16)), in_channels=r.choice((64, 128)),
                out_channels=r.choice((8, 24, 64, 128, 200)), input_size=(size,) * rank, filter_size=(f,) * rank,
                stride=r.choice((1, 1, 2)), dilation=r.choice((1, 1, 2)), pad_low=r.randint(0, f // 2 + 1),
                pad_high=r.randint(0, f // 2 + 1), dtype=dtype, dw_dtype=r.choice((dtype, "f32")),
                layout=r.choice((_LAYOUTS[0], _LAYOUTS[0], _LAYOUTS[0], _LAYOUTS[4], _LAYOUTS[1])), epilogue=ep,
            )  # fmt: skip
        except ValueError:
            continue
        if p.flops <= 4e9:
            return "hopper", p


def depthwise_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a problem of the depthwise kernel, issue 40): 1- to 3-D, one channel a group (G any, odd
    included), filters 2 to 31 along the innermost dimension, strides 1-2, dilations 1-2, causal (left-only)
    pads as often as symmetric ones, odd extents, f16/bf16 with dW in the input type or f32, channels-last."""
    while True:
        rank = r.choices((1, 2, 3), (3, 5, 2))[0]
        inner = r.choice((2, 3, 3, 4, 5, 7, 7, 9, 11, 15, 31) if rank < 3 else (2, 3, 3))
        filt = tuple(r.choice((1, 3, 5, 7)) if rank > 1 and d < rank - 1 else inner for d in range(rank))
        filt = tuple(f if rank < 3 or d == rank - 1 else r.choice((1, 3)) for d, f in enumerate(filt))
        size = tuple(r.randint(max(3, f), {1: 300, 2: 40, 3: 12}[rank]) for f in filt)
        stride = tuple(r.choice((1, 1, 2)) for _ in range(rank))
        dilation = tuple(r.choice((1, 1, 1, 2)) for _ in range(rank))
        causal = r.random() < 0.4
        pad_low = tuple((f - 1) * d if causal else ((f - 1) * d) // 2 for f, d in zip(filt, dilation))
        pad_high = tuple(0 if causal else p for p in pad_low)
        dtype = r.choice(("f16", "f16", "bf16"))
        try:
            p = ConvBwdWeightProblem(
                groups=r.choice((3, 5, 8, 12, 24, 32, 40, 64, 96, 144, 256)), batch=r.choice((1, 2, 3, 4, 8, 16)),
                in_channels=1, out_channels=1, input_size=size, filter_size=filt, stride=stride, dilation=dilation,
                pad_low=pad_low, pad_high=pad_high, dtype=dtype, dw_dtype=r.choice((dtype, dtype, "f32")),
                layout=_LAYOUTS[0],
            )  # fmt: skip
        except ValueError:
            continue
        if p.flops <= 4e9:
            return "causal" if causal else "depthwise", p


# The GEMV kernel asked for (profile ``gemv``): beside the plan's own choice on every problem.
_GEMV_ALTERNATIVES = ("strategy=gemv",)


def gemv_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a GEMV-like problem: K or C at most 8, the other up to 64 or 512): 1- to 3-D, f16/bf16, layouts 2
    and 4, at most 4 groups, strides, dilations, asymmetric pads, one image or several."""
    while True:
        rank = r.choices((1, 2, 3), (3, 4, 3))[0]
        lo, hi = {1: (8, 300), 2: (3, 24), 3: (3, 10)}[rank]
        size = r.randint(lo, hi)
        inputs = tuple(size if r.random() < 0.7 else r.randint(lo, hi) for _ in range(rank))
        f = r.choice({1: (1, 3, 5, 10), 2: (1, 3, 3, 5, 7), 3: (1, 3, 3)}[rank])
        filt = tuple(f if r.random() < 0.8 else r.choice((1, 2, 3)) for _ in range(rank))
        narrow, wide = r.choice((1, 1, 2, 3, 4, 5, 8)), r.choice((1, 3, 8, 16, 24, 32, 64, 512))
        c, k = (narrow, wide) if r.random() < 0.5 else (wide, narrow)
        dtype = r.choice(("f16", "f16", "bf16"))
        try:
            p = ConvBwdWeightProblem(
                groups=r.choice((1, 1, 1, 2, 4)), batch=r.choice((1, 1, 2, 3, 4, 8)), in_channels=c,
                out_channels=k, input_size=inputs, filter_size=filt,
                stride=tuple(r.choice((1, 1, 2, 3, 5)) for _ in range(rank)),
                dilation=tuple(r.choice((1, 1, 1, 2)) for _ in range(rank)),
                pad_low=tuple(r.randint(0, max(filt)) if r.random() < 0.6 else 0 for _ in range(rank)),
                pad_high=tuple(r.randint(0, max(filt)) if r.random() < 0.5 else 0 for _ in range(rank)),
                dtype=dtype, dw_dtype=r.choice((dtype, "f32")), layout=r.choice((_LAYOUTS[0],) * 4 + (_LAYOUTS[4],)),
            )  # fmt: skip
        except ValueError:
            continue
        if p.flops <= 4e9:
            return "gemv", p


# The wgmma kernel's boxed form (profile ``thin90``, issue 40 item 2) asked for on every problem, ``M`` its most
# groups a box (policies.sm90.merge_for), sometimes with a split, another width, or ``S`` the fewest groups a box
# (one where C and K are multiples of 8: box starts on 16 bytes); no plan's own choice beside it (the sm_80 kernel,
# checked by the other profiles).
_THIN90_ALTERNATIVES = ("strategy=explicit&wgmma_merge=M", "strategy=explicit&wgmma_merge=M",
                        "strategy=explicit&wgmma_merge=M&k_batch=3", "strategy=explicit&wgmma_merge=M&tile_n=128",
                        "strategy=explicit&wgmma_merge=M&tile_n=256", "strategy=explicit&wgmma_merge=S")  # fmt: skip


def thin90_problem(r: random.Random) -> tuple[str, ConvBwdWeightProblem]:
    """(class, a problem of the boxed form): groups of 2-56 channels (thin: <= 16, else medium), K even or odd with
    G C and G K multiples of 8, ragged boxes (G not a multiple of the groups a box), 1- to 3-D, strides, dilations,
    asymmetric pads, f16/bf16, dW in the input type or f32, layout 2, small (the float64 check is cheap)."""
    from convbw_mlir.policies import sm90

    while True:
        rank = r.choices((1, 2, 3), (2, 6, 2))[0]
        c = r.choice((2, 4, 4, 6, 8, 8, 12, 16, 16, 24, 24, 32, 40, 48, 56, 56))
        k = r.choice((c, c, c, 2, 4, 8, 12, 16, 24, 40, 56, 64, 72))
        g = r.choice([g for g in range(2, 41) if (g * c) % 8 == 0 and (g * k) % 8 == 0] or [8])
        f = r.choice({1: (1, 3, 5, 9), 2: (1, 3, 3, 3, 5), 3: (1, 3)}[rank])
        size = r.randint(*{1: (8, 80), 2: (3, 16), 3: (3, 6)}[rank])
        dtype = r.choice(("f16", "bf16"))
        try:
            p = ConvBwdWeightProblem(
                groups=g, batch=r.choice((1, 2, 3, 4, 8)), in_channels=c, out_channels=k,
                input_size=tuple(size if r.random() < 0.7 else r.randint(3, size + 3) for _ in range(rank)),
                filter_size=(f,) * rank, stride=r.choice((1, 1, 2)), dilation=r.choice((1, 1, 1, 2)),
                pad_low=r.randint(0, f // 2 + 1), pad_high=r.randint(0, f // 2 + 1), dtype=dtype,
                dw_dtype=r.choice((dtype, "f32")), layout=_LAYOUTS[0],
            )  # fmt: skip
        except ValueError:
            continue
        if p.flops <= 3e8 and sm90.merge_for(p):  # a width whose box starts are on 16 bytes (merge_misaligned)
            return "thin" if max(c, k) <= 16 else "medium", p


def _contender(options: dict[str, Any]) -> str:
    return "convbw:" + ",".join(f"{k}={v}" for k, v in options.items()) if options else "convbw"


# -- compile side ----------------------------------------------------------------------------------------
def _compile_entries(entries: list[dict], target: str, folder: str) -> list[dict]:
    """Compile the contenders of ``entries`` in this process (a child of :func:`compile_all`)."""
    from convbw_mlir.build.compile import lowered_text
    from convbw_mlir.build.contenders import build_contender, direct_contender
    from convbw_mlir.build.iree import CompileError, compile_module
    from convbw_mlir.pipelines import for_target
    from convbw_mlir.plan import decide
    from convbw_mlir.policies import sm90

    for entry in entries:
        problem = ConvBwdWeightProblem.from_dict(entry["problem"])
        for name, options in entry.pop("options").items():
            path = f"{entry['key']}.{name.replace(':', '.').replace(',', '.').replace('=', '')}.vmfb"
            try:
                if name in IREE_FORMS:  # IREE's own forms and the GPU reference: rivals, no plan of ours
                    text, flags = build_contender(problem, name, target)
                    if text is None:
                        raise ValueError("no such form for this problem")
                    (Path(folder) / path).write_bytes(compile_module(text, target, flags))
                    entry["contenders"][name] = {"ok": True, "vmfb": path, "flags": [], "config": {"strategy": name}}
                    continue
                plan = decide(problem, target, **options)
                if sm90.is_sm90(plan):  # TMA maps: the runner launches it directly (its schedule beside the vmfb)
                    rec = direct_contender(problem, options, target, Path(folder), path)
                    if rec is not None:
                        entry["contenders"][name] = rec | {"config": _config(plan)}
                        continue
                vmfb = compile_module(lowered_text(problem, for_target(target, **options)), target)
            except (CompileError, ValueError) as e:
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                entry["contenders"][name] = {"ok": False, "error": first}
                continue
            (Path(folder) / path).write_bytes(vmfb)
            entry["contenders"][name] = {"ok": True, "vmfb": path, "flags": [], "config": _config(plan)}
    return entries


def _config(plan: Any) -> dict[str, Any]:
    """What the report groups results by: the plan's strategy (``+wgmma``: the sm_90a kernel) and split."""
    from convbw_mlir.policies import sm90

    split = plan.split
    kind = "+wgmma" if sm90.is_sm90(plan) else "+tile" if plan.simt or plan.tile else ""
    return {"strategy": plan.strategy.value + kind + ("+streamk" if plan.streamk else ""),
            "k_batch": split.k_batch if split else 1,
            "split": f"{split.dim}x{split.k_batch}" if split else "-"}  # fmt: skip


def _chunk_child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    done = _compile_entries(spec["entries"], spec["target"], spec["folder"])
    Path(spec["result"]).write_text(json.dumps(done))
    return 0


def _compile_chunk(entries: list[dict], target: str, folder: Path) -> list[dict]:
    """Compile ``entries`` in one child; where the compiler kills it, each entry (then each contender) again
    in its own child."""
    with tempfile.TemporaryDirectory(prefix="convbw-fuzz-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(
            json.dumps({"entries": entries, "target": target, "folder": str(folder), "result": str(result)})
        )
        rc = subprocess.run([sys.executable, __file__, "_chunk", str(spec)], capture_output=True, text=True)
        if rc.returncode == 0:
            return json.loads(result.read_text())
    if len(entries) > 1:
        return [e for entry in entries for e in _compile_chunk([entry], target, folder)]
    if len(entries[0]["options"]) > 1:  # one contender at a time: a crash is charged to its own choice only
        merged = dict(entries[0], contenders={})
        for name, opts in entries[0]["options"].items():
            merged["contenders"] |= _compile_chunk([dict(entries[0], options={name: opts})], target, folder)[0][
                "contenders"
            ]
        merged.pop("options")
        return [merged]
    entry = dict(entries[0])
    why = (rc.stderr.strip().splitlines() or [f"exit {rc.returncode}"])[-1][:300]
    entry["contenders"] = {n: {"ok": False, "error": f"compiler crashed: {why}"} for n in entry.pop("options")}
    return [entry]


def _taken(opts: dict[str, Any], p: ConvBwdWeightProblem, alternatives: tuple[str, ...],
           r: random.Random) -> dict[str, Any]:  # fmt: skip
    """``opts`` where sm_90a's plan takes them, else the first of ``alternatives`` (in ``r``'s order) it takes, else
    ``opts`` (the refusal is then the entry's record): a split past a tiny problem's k tiles is refused, and the
    thin90 run of 2026-12-06 spent 3 of its 40 fresh problems on such draws."""
    from convbw_mlir.plan import PlanError, decide

    for candidate in (opts, *(_options(a, p) for a in r.sample(alternatives, len(alternatives)))):
        try:
            decide(p, "sm_90a", **candidate)
        except PlanError:
            continue
        return candidate
    return opts


def plan_entries(count: int, seed: int, alternative_share: float, profile: str = "any") -> list[dict]:
    """``count`` random problems, each with the plan's choice and, for a share, one other choice."""
    entries = []
    profiles = {"explicit": (explicit_problem, _EXPLICIT_ALTERNATIVES),
                "hopper": (hopper_problem, _HOPPER_ALTERNATIVES),
                "depthwise": (depthwise_problem, ("strategy=codegen",)),
                "gemv": (gemv_problem, _GEMV_ALTERNATIVES),
                "thin90": (thin90_problem, _THIN90_ALTERNATIVES)}  # fmt: skip
    draw, alternatives = profiles.get(profile, (random_problem, _ALTERNATIVES))
    prefix = "fuzz" if profile == "any" else profile
    for i in range(count):
        r = random.Random(seed * 1_000_003 + i)
        cls, p = draw(r)
        options = {} if profile == "thin90" else {"convbw": {}}  # thin90: the boxed form only
        if profile == "thin90" or r.random() < alternative_share:
            opts = _options(r.choice(alternatives), p)
            if profile == "thin90":  # a draw the plan refuses builds nothing: another the plan takes
                opts = _taken(opts, p, alternatives, random.Random(f"{seed}/{i}"))
            options[_contender(opts)] = opts
        key = f"{prefix}{i:04d}.{p.dtype}"
        entries.append(
            {
                "name": f"{prefix}{i:04d}",
                "key": key,
                "class": cls,
                "problem": p.to_dict(),
                "options": options,
                "contenders": {},
            }
        )
    return entries


def overread_sweep() -> list[dict]:
    """The over-read class by name: problems IREE tiles itself (SIMT without a thread tile, or IREE's
    config), each unsplit, with the plan's split and with batch splits whose per-split reduction is or
    is not a multiple of 16 (the issue's reproducer first)."""
    cks = [
        "1 4 3 5 3 4 40 3 3 4 2",  # the reproducer: 13 output positions a split of one image
        "1 8 16 4 2 3 30 1 1 1 1",  # 1-D thin groups: 30 positions
        "1 8 16 4 2 3 32 1 1 1 1",  # 32 positions
        "2 32 32 4 4 3 3 7 7 1 1 1 1 1 1 1 1",  # thin groups 7x7: 49
        "2 32 32 4 4 3 3 8 8 1 1 1 1 1 1 1 1",  # 8x8: 64
        "2 64 8 1 1 3 3 13 13 1 1 1 1 1 1 1 1",  # depthwise 13x13: 169
        "2 64 8 1 1 3 3 16 16 1 1 1 1 1 1 1 1",  # depthwise 16x16: 256
        "2 16 4 1 1 7 7 14 14 2 2 1 1 3 3 3 3",  # depthwise 7x7 stride 2: 49
        "3 8 4 2 2 3 3 3 5 5 5 1 1 1 1 1 1 1 1 1 1 1 1",  # 3-D thin: 125
        "2 1 8 16 3 7 7 23 23 2 2 1 1 3 3 3 3",  # first layer, C=3: 144 (our MMA tile)
        "2 1 8 16 3 7 7 21 21 2 2 1 1 3 3 3 3",  # 121
    ]
    entries = []
    for i, ck in enumerate(cks):
        p = ConvBwdWeightProblem.from_ck(ck)
        options: dict[str, dict] = {"convbw": {}, "convbw:k_batch=1": {"k_batch": 1}}
        for kb in sorted({p.batch, 2}):
            options[f"convbw:k_batch={kb}"] = {"k_batch": kb}
        key = f"sweep{i:02d}.{p.dtype}"
        entries.append(
            {
                "name": f"sweep{i:02d}",
                "key": key,
                "class": ck,
                "problem": p.to_dict(),
                "options": options,
                "contenders": {},
            }
        )
    return entries


def recheck_entries(manifests: list[Path], results: list[Path], alternatives: tuple[str, ...],
                    ours_only: bool = False) -> list[dict]:  # fmt: skip
    """The problems of earlier runs with a contender that was not correct (each once): each again with the
    plan's choice now, the same contenders, and ``alternatives`` (other plans and IREE's forms), to find
    which choice is right where one is wrong; ``ours_only`` leaves IREE's own forms out."""
    rows = {(m, row["key"]): row for m, r in zip(manifests, results) for row in json.loads(r.read_text())["problems"]}
    entries, seen = [], set()
    for manifest in manifests:
        for e in json.loads(manifest.read_text())["problems"]:
            row = rows.get((manifest, e["key"]))
            same = json.dumps(e["problem"], sort_keys=True)
            if same in seen or row is None or not any(c.get("status") == "WRONG" for c in row["contenders"].values()):
                continue
            seen.add(same)
            if any(x["key"] == e["key"] for x in entries):  # another run's problem of the same name
                e = {**e, "key": f"{manifest.stem}.{e['key']}", "name": f"{manifest.stem}.{e['name']}"}
            p = ConvBwdWeightProblem.from_dict(e["problem"])
            names = list(e["contenders"]) + [a for a in alternatives if a not in e["contenders"]]
            options = {}
            for name in names:
                if name in IREE_FORMS and not ours_only:
                    options[name] = {}
                elif name in IREE_FORMS:
                    continue
                else:
                    opts = _options(name.partition(":")[2].replace(",", "&"), p) if ":" in name else {}
                    options[_contender(opts)] = opts
            entries.append({**e, "options": options, "contenders": {}})
    return entries


def compile_all(entries: list[dict], target: str, out: Path, workers: int, chunk: int = 20) -> Path:
    """Compile every entry into ``out`` (refused if it exists), ``workers`` children at a time; writes the manifest."""
    from importlib.metadata import version

    if out.exists():
        raise SystemExit(f"error: --out: {out} exists (give a new folder)")
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True)
    chunks = [entries[i : i + chunk] for i in range(0, len(entries), chunk)]
    done: list[dict] = []
    t0 = time.time()
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda c: _compile_chunk(c, target, tmp), chunks):
            done += part
            print(f"{len(done)}/{len(entries)} compiled ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    manifest = {"target": target, "date": time.strftime("%Y-%m-%d"), "iree_version": version("iree-base-compiler"),
                "contenders": sorted({n for e in done for n in e["contenders"]}), "problems": done}  # fmt: skip
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.rename(out)
    return out


# -- run side --------------------------------------------------------------------------------------------
def _run_shard(folder: Path, shard: int, shards: int, timeout_s: float) -> dict:
    """Run every ``shards``-th problem of the manifest in a child (``python -m convbw_mlir.measure.run``'s runner)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["problems"] = manifest["problems"][shard::shards]
    for entry in manifest["problems"]:
        for rec in entry["contenders"].values():
            if rec.get("ok"):  # absolute: the shard's manifest lives elsewhere (a direct launch's folder too)
                rec.update({k: str(folder / rec[k]) for k in ("vmfb", "launch") if rec.get(k)})
    with tempfile.TemporaryDirectory(prefix=f"convbw-shard{shard}-") as tmp:
        (Path(tmp) / "manifest.json").write_text(json.dumps(manifest))
        out = Path(tmp) / "results.json"
        code = ("import json, sys; from convbw_mlir.measure.run import run_manifest; "
                f"r = run_manifest({tmp!r}, use_torch=False, check_only=True, timeout_s={timeout_s}, "
                "log=lambda m: print(m, file=sys.stderr, flush=True)); "
                f"open({str(out)!r}, 'w').write(json.dumps(r))")  # fmt: skip
        subprocess.run([sys.executable, "-c", code], check=False)
        results = json.loads(out.read_text()) if out.exists() else {"problems": [], "error": "shard died"}
    classes = {e["key"]: e.get("class") for e in manifest["problems"]}
    for row in results["problems"]:
        row["class"] = classes.get(row["key"])
    return results


def run_served(folder: Path, timeout_s: float) -> dict:
    """Every problem through one measuring process (the runner's server, ``check_only``): the same fenced checks
    as the shards, without a process start a problem (~20 s each there), for a GPU used by nobody else."""
    from convbw_mlir.measure.run import run_manifest

    manifest = json.loads((folder / "manifest.json").read_text())
    results = run_manifest(folder.resolve(), use_torch=False, check_only=True, timeout_s=timeout_s, server=True,
                           log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    classes = {e["key"]: e.get("class") for e in manifest["problems"]}
    for row in results["problems"]:
        row["class"] = classes.get(row["key"])
    return results


def run_all(folder: Path, shards: int, timeout_s: float) -> dict:
    folder = folder.resolve()
    with ThreadPoolExecutor(shards) as pool:
        parts = list(pool.map(lambda s: _run_shard(folder, s, shards, timeout_s), range(shards)))
    merged = {k: v for k, v in parts[0].items() if k != "problems"}
    # the GPU's name; the runner names the driver only where torch is not asked for
    merged["device"] = harness.gpu_name() or merged.get("device")
    merged["problems"] = sorted((row for p in parts for row in p["problems"]), key=lambda r: r["key"])
    merged["shards_died"] = sum(1 for p in parts if "error" in p)
    return merged


# -- report ----------------------------------------------------------------------------------------------
def _verdict(res: dict) -> str:
    status = res.get("status")
    if status == "ok":
        return "correct"
    if status == "WRONG":
        return "over-read (NaN)" if "reads past" in res.get("error", "") else "wrong"
    if status == "no kernel":
        return "refused / no kernel"
    return status or "?"


def report(results: list[dict]) -> str:
    rows = [row for r in results for row in r["problems"]]
    by_strategy: dict[str, Counter] = defaultdict(Counter)
    by_class: dict[str, Counter] = defaultdict(Counter)
    total: Counter = Counter()
    bad = []
    for row in rows:
        for name, res in row["contenders"].items():
            v = _verdict(res)
            total[v] += 1
            cfg = res.get("config") or {}
            strategy = (
                f"{cfg.get('strategy', '-')} ({'split ' + cfg['split'] if cfg.get('split', '-') != '-' else 'unsplit'})"
            )
            if v != "refused / no kernel":
                by_strategy[strategy][v] += 1
                by_class[str(row.get("class"))][v] += 1
            if v not in ("correct", "refused / no kernel"):
                bad.append(f"| {row['key']} | {name} | {strategy} | {v} | {res.get('error', '')[:160]} |")
    verdicts = ["correct", "wrong", "over-read (NaN)", "crashed", "failed"]
    head = "| | " + " | ".join(verdicts) + " |\n|---|" + "---:|" * len(verdicts)
    devices = ", ".join(sorted({str(r.get("device")) for r in results}))
    counts = ", ".join(f"{k} {v}" for k, v in total.most_common())
    out = [f"devices: {devices}; problems: {len(rows)}; contenders: {sum(total.values())} ({counts})", ""]
    for title, table in (("strategy (plan)", by_strategy), ("class", by_class)):
        out += [f"### By {title}", "", head]
        out += [f"| {k} | " + " | ".join(str(c[v]) for v in verdicts) + " |" for k, c in sorted(table.items())]
        out.append("")
    out += ["### Not correct", "", "| problem | contender | plan | verdict | error |", "|---|---|---|---|---|", *bad]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_chunk"]:
        return _chunk_child(argv[1])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--count", type=int, default=500)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--sweep", choices=["overread"], help="the named sweep instead of random problems")
    c.add_argument(
        "--recheck",
        nargs=2,
        action="append",
        metavar=("MANIFEST", "RESULTS"),
        help="the problems with a wrong contender in an earlier run, again, with other choices",
    )
    c.add_argument(
        "--profile",
        choices=["any", "explicit", "hopper", "depthwise", "gemv", "thin90"],
        default="any",
        help="explicit: problems and choices of the explicit kernels; hopper: of the sm_90a kernel (--target sm_90a); "
        "depthwise: of the depthwise kernel (issue 40); gemv: GEMV-like problems, the plan and the GEMV kernel "
        "(--alternatives 1); thin90: the wgmma kernel's boxed form for thin and medium groups (--target sm_90a)",
    )
    c.add_argument("--alternatives", type=float, default=0.5, help="share of problems with one other plan choice")
    c.add_argument(
        "--recheck-with",
        default=",".join(RECHECK_ALTERNATIVES),
        help="with --recheck: the other choices besides the earlier run's, comma-separated ('' for none)",
    )
    c.add_argument("--ours-only", action="store_true", help="with --recheck: leave IREE's own forms out")
    c.add_argument("--target", default="sm_80")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("--shards", type=int, default=8)
    r.add_argument("--server", action="store_true", help="one measuring process (the runner's server), no shards")
    r.add_argument("--timeout", type=float, default=60.0)
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("results", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        if args.recheck:
            alternatives = tuple(a for a in args.recheck_with.split(",") if a)
            entries = recheck_entries(
                [Path(m) for m, _ in args.recheck], [Path(r) for _, r in args.recheck], alternatives, args.ours_only
            )
        elif args.sweep:
            entries = overread_sweep()
        else:
            entries = plan_entries(args.count, args.seed, args.alternatives, args.profile)
        print(compile_all(entries, args.target, Path(args.out), args.workers))
    elif args.cmd == "run":
        t0 = time.time()
        if args.server:
            results = run_served(Path(args.folder), args.timeout)
        else:
            results = run_all(Path(args.folder), args.shards, args.timeout)
        results["seconds"] = round(time.time() - t0)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        print(report([results]))
    else:
        print(report([json.loads(Path(f).read_text()) for f in args.results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
