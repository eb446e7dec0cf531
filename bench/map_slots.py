"""The tensor-map slots' pool on a GPU (issue 37): right when slots are reused every few calls, and memory flat.

    CONVBW_ARTIFACTS=ART python3 bench/map_slots.py check --slots 2 --json OUT.json [--native]
    CONVBW_ARTIFACTS=ART CONVBW_TENSOR_MAP_SLOTS=2 python3 bench/map_slots.py steps --steps 200 --json OUT.json

``check``: every weight gradient of one ResNet-50 step (bf16 autocast, channels-last, batch 64, recorded as the switch
sees it), each computed ``--repeats`` times on new inputs queued back to back (x and dy scaled per repeat, all alive:
a new address pair a call, the host ahead of the GPU), first with a pool too large to reuse a slot (the unbounded
path, as before the pool), then with ``--slots`` slots a kernel (reused every few calls, waiting for the GPU where its
reads are still queued). NaN fence: before each call a block of dW's size is filled with NaN and freed, so a dW
nobody wrote shows. Right means: every dW finite, bit for bit the unbounded path's on the same inputs (the same
kernel; a slot overwritten before the GPU read it would hand a kernel another call's tensor map), and the first
repeat's within the documented bound of torch's (``measure.checks.tolerance_rms`` of ours plus torch's, both bf16
with f32 accumulation). ``--native``: through the C++ hot path (with ``$CONVBW_TORCH_NATIVE_LAUNCH=1`` its own pool).

``steps``: two ResNet-50 copies training in turns with every dW ours (so a layer's x and dy move call to call, as in
bench/train_step.py), ``--steps`` steps; every 10 steps the device's free memory (``cuMemGetInfo``: the slots are
the driver's allocations, outside torch's pool), torch's reserved memory, the slots held (Python launchers' and
C++), tensor-map encodings, waits, graphs. Flat means: the slots stop growing once each kernel has its ``cap``
(plus the slots its CUDA graphs hold, at most 64 graphs a kernel) while the encodings keep growing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
UNBOUNDED = 1_000_000  # slots a kernel: never reused in these runs (the path before the pool)


def _pool_stats() -> dict:
    from convbw_mlir.torch import entry, native

    calls = entry.direct_calls()
    slots = [getattr(c.launcher, "slots", None) for c in calls]
    cxx_slots, cxx_waits = native.map_slots()
    return {"kernels": len(calls), "slots_python": sum(len(s.device) for s in slots if s),
            "pinned_python": sum(len(s.pinned) for s in slots if s), "waits_python": sum(s.waits for s in slots if s),
            "encodings_python": sum(getattr(c.launcher, "encodings", 0) for c in calls),
            "graphs": sum(len(c._graphs) for c in calls), "slots_cxx": cxx_slots, "waits_cxx": cxx_waits,
            "cxx_plain_launches": native.plain_launches()}  # fmt: skip


def _bound(args: tuple, want) -> float | None:  # noqa: ANN001
    """Ours' tolerance plus torch's (both bf16 dW, f32 accumulation with matrix instructions), RMS units."""
    try:
        from convbw_mlir import torch as ct
        from convbw_mlir.measure.checks import tolerance_rms
        from convbw_mlir.torch import switch as sw

        go, x, w, _, stride, padding, dilation, _, _, groups = args
        xd = sw._dense(x)
        problem, _ = ct.problem_for(xd, w.shape, sw._like(go, xd), stride, padding, dilation, groups)
        rms = float(want.square().mean().sqrt())
        peak = float(want.abs().max()) / max(rms, 1e-30)
        return 2 * tolerance_rms(problem, "bf16", peak, mma=True, rms=rms)
    except Exception as e:  # the figure is reported either way
        print(f"bound: {type(e).__name__}: {e}", flush=True)
        return None


def check(ns: argparse.Namespace) -> int:
    import torch
    from train_step import backward_calls

    from convbw_mlir import cuda_launch
    from convbw_mlir import torch as ct
    from convbw_mlir.torch import entry, native

    calls = backward_calls(ns.model, ns.batch, "cuda")
    aten = torch.ops.aten.convolution_backward.default

    def fenced_dw(args: tuple) -> torch.Tensor:
        w = args[2]
        fence = torch.full((w.numel(),), float("nan"), dtype=w.dtype, device="cuda")
        del fence  # back to the allocator, NaN inside: dW is handed this block
        return aten(*args, [False, True, False])[1]

    def inputs(args: tuple, r: int) -> tuple:  # repeat r: x and dy scaled (new memory, new values: new results)
        go, x = args[:2]
        return (go * (1 + r / 8), x * (1 - r / 16), *args[2:])

    results: dict[int, list[list]] = {}
    ours: dict[int, list[int]] = {}  # per cap, per layer: calls the switch computed with our kernel
    stats = {}
    for cap in (UNBOUNDED, ns.slots):
        os.environ[cuda_launch.MAP_SLOTS_ENV] = str(cap)
        entry.forget_kernels()  # new launchers: the cap is read when one is built
        ct.enable(benchmark=False, native=ns.native)
        if ns.native and native.loaded() is None:
            sys.exit("check: the C++ hot path did not build")
        start = time.perf_counter()
        outs, ours[cap], total, plain = [], [], {}, 0
        results[cap] = outs
        for args in calls:
            ct.reset_stats()  # (the C++ counters too)
            batch = [inputs(args, r) for r in range(ns.repeats)]
            got = [fenced_dw(a) for a in batch]  # queued back to back: the host runs ahead of the GPU
            torch.cuda.synchronize()
            outs.append([t.cpu() for t in got])
            del batch, got
            layer_stats, plain = ct.stats(), plain + native.plain_launches()
            ours[cap].append(layer_stats.get("ours", 0))
            for k, v in layer_stats.items():
                total[k] = total.get(k, 0) + v
        stats[cap] = _pool_stats() | {"switch": total, "cxx_plain_launches": plain,
                                      "seconds": time.perf_counter() - start}  # fmt: skip
        ct.disable()
        print(f"cap {cap}: {json.dumps(stats[cap])}", flush=True)
    rows, ok = [], True
    for i, args in enumerate(calls):
        want = aten(*inputs(args, 0), [False, True, False])[1].float().cpu()  # disable()d: torch's
        small, big = results[ns.slots][i], results[UNBOUNDED][i]
        finite = all(bool(torch.isfinite(t).all()) for t in small + big)
        # bit for bit where our kernel computed every repeat (torch's own, where the switch gave it a layer, need not
        # repeat itself: cuDNN's wgrad may sum in any order)
        is_ours = ours[ns.slots][i] == ours[UNBOUNDED][i] == ns.repeats
        differ = [r for r in range(ns.repeats) if is_ours and not torch.equal(small[r], big[r])]
        rms = float(want.square().mean().sqrt())
        rel = float((small[0].float() - want).abs().max()) / max(rms, 1e-30)
        bound = _bound(inputs(args, 0), want)
        within = bound is None or rel <= bound
        ok &= finite and not differ and within
        row = {"layer": i, "weight": list(args[2].shape), "x": list(args[1].shape), "ours": is_ours, "finite": finite,
               "differ_from_unbounded": differ, "rel_vs_torch": rel, "bound": bound, "within": within}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    reused = stats[ns.slots]["slots_python"] + stats[ns.slots]["slots_cxx"] < sum(
        stats[ns.slots][k] for k in ("encodings_python", "cxx_plain_launches")
    )  # fewer slots than encodings: slots were reused
    ok &= reused and any(r["ours"] for r in rows)  # else the check ran nothing it is about
    out = {"model": ns.model, "batch": ns.batch, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "native": ns.native, "native_launch": entry.native_launch_wanted(), "slots": ns.slots,
           "repeats": ns.repeats, "stats": {str(k): v for k, v in stats.items()}, "layers": rows, "reused": reused,
           "ok": ok}  # fmt: skip
    ns.json.write_text(json.dumps(out, indent=1))
    print(f"{len(rows)} weight gradients ({sum(r['ours'] for r in rows)} ours) x {ns.repeats} repeats; with "
          f"{ns.slots} slots a kernel: "
          f"{sum(bool(r['differ_from_unbounded']) for r in rows)} layers differ from the unbounded path, "
          f"{sum(not r['finite'] for r in rows)} not finite, {sum(not r['within'] for r in rows)} outside the bound "
          f"(max rel vs torch {max(r['rel_vs_torch'] for r in rows):.3g}); slots {stats[ns.slots]['slots_python']} "
          f"Python + {stats[ns.slots]['slots_cxx']} C++, waits {stats[ns.slots]['waits_python']} + "
          f"{stats[ns.slots]['waits_cxx']}, slots reused {reused}; check ok: {ok}", flush=True)  # fmt: skip
    return 0 if ok else 1


def steps(ns: argparse.Namespace) -> int:
    import torch
    from models import MODELS

    from convbw_mlir import torch as ct

    build, shape, fmt, loss_fn, target = MODELS[ns.model]
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(ns.batch, *shape, generator=g).cuda().contiguous(memory_format=fmt),
                target(ns.batch, g).cuda()) for _ in range(4)]  # fmt: skip
    copies = []
    for _ in range(2):  # two models in turns: each step finds the allocator as the other left it
        torch.manual_seed(0)
        model = build().cuda().to(memory_format=fmt)
        copies.append((model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)))
    ct.enable(benchmark=False, native=ns.native)
    rows, losses = [], []
    start = time.perf_counter()
    for i in range(ns.steps):
        model, opt = copies[i % 2]
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if (i + 1) % 10 == 0:
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            losses.append(float(loss))
            row = {"step": i + 1, "free_mib": free / 2**20, "reserved_mib": torch.cuda.memory_reserved() / 2**20,
                   "loss": losses[-1], "seconds": time.perf_counter() - start} | _pool_stats()  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    stats = ct.stats()
    ct.disable()
    first = rows[min(1, len(rows) - 1)]  # after step 20: both copies warm, their decisions made
    last = rows[-1]
    out = {"model": ns.model, "batch": ns.batch, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "native": ns.native, "slots_env": os.environ.get("CONVBW_TENSOR_MAP_SLOTS"), "steps": ns.steps,
           "switch": stats, "rows": rows, "finite_losses": all(v == v and abs(v) < 1e30 for v in losses),
           "free_mib_change_after_step_20": last["free_mib"] - first["free_mib"],
           "reserved_mib_change_after_step_20": last["reserved_mib"] - first["reserved_mib"],
           "slots_growth_after_step_20": (last["slots_python"] + last["slots_cxx"])
           - (first["slots_python"] + first["slots_cxx"]),
           "encodings_growth_after_step_20": last["encodings_python"] - first["encodings_python"]}  # fmt: skip
    ns.json.write_text(json.dumps(out, indent=1))
    print(f"{ns.steps} steps, slots env {out['slots_env']}: free device memory "
          f"{out['free_mib_change_after_step_20']:+.1f} MiB after step 20 (torch reserved "
          f"{out['reserved_mib_change_after_step_20']:+.1f}); slots "
          f"{last['slots_python']} Python + {last['slots_cxx']} C++ ({out['slots_growth_after_step_20']:+d} after step "
          f"20), encodings {last['encodings_python']} ({out['encodings_growth_after_step_20']:+d}), graphs "
          f"{last['graphs']}, waits {last['waits_python']} + {last['waits_cxx']}; losses finite "
          f"{out['finite_losses']}", flush=True)  # fmt: skip
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("check", "steps"):
        q = sub.add_parser(name)
        q.add_argument("--model", default="resnet50")
        q.add_argument("--batch", type=int, default=64)
        q.add_argument("--native", action="store_true", help="through the C++ hot path (enable(native=True))")
        q.add_argument("--json", type=Path, required=True)
        if name == "check":
            q.add_argument("--slots", type=int, default=2, help="the pool's size a kernel (reused every few calls)")
            q.add_argument("--repeats", type=int, default=6, help="calls a layer, queued back to back, new inputs")
        else:
            q.add_argument("--steps", type=int, default=200)
    ns = p.parse_args()
    return check(ns) if ns.cmd == "check" else steps(ns)


if __name__ == "__main__":
    raise SystemExit(main())
