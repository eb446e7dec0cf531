"""The zoo's raise count (issue 41): of every weight-gradient convolution in the zoo's training steps, how many
``convbw-raise`` takes, and why each other one is left to IREE.

Two halves, on two machines (torchvision does not load on this machine's CPU torch; IREE's compiler is only here):

    python3 bench/raise_zoo.py export --out DIR [--models resnet18,...]     # there: torch + torchvision (+ timm,
        # transformers where installed); each zoo model's training step (bench/step_export.py: eval mode, f32,
        # batch 2, the zoo's input sizes, parameters as inputs: no weights in the files) as DIR/<model>.pt2.gz,
        # and DIR/export.json (torch's version, each model's status and why one did not export); --jobs 12: twelve
        # models at a time, each in its own process
    .venv/bin/python bench/raise_zoo.py count DIR [--out bench/results/raise_zoo_2026-12-06]      # here

``count`` loads each ``.pt2`` or ``.pt2.gz`` (torch.export.load), counts its ``aten.convolution_backward`` calls
that compute the weight gradient (output mask's second entry) as the problems they are, runs IREE's input phase
(in a child process: a crash is that model's failure) and ``convbw-raise{remarks=true}``, and matches the raised
problems to the counted ones. Each one left over is exported again alone (the same call, shapes and type) and
raised alone: the remark there is its reason. Writes ``count.json`` and ``count.md``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))  # convbw_mlir.torch.zoo from the checkout where no wheel is installed

import torch  # noqa: E402

__all__ = ["count_model", "expected_convs", "export_one", "export_zoo", "main", "match"]

# a problem as both sides know it: groups, batch, C and K a group, input size, filter, stride, dilation, low pads
Key = tuple


def _key(groups: int, n: int, c: int, k: int, size, filt, stride, dil, pad) -> Key:  # noqa: ANN001
    return (groups, n, c, k, *(tuple(int(v) for v in t) for t in (size, filt, stride, dil, pad)))


def _describe(key: Key) -> str:
    g, n, c, k, size, filt, stride, dil, pad = key
    x = lambda t: "x".join(map(str, t))  # noqa: E731
    return f"G={g} N={n} C={c} K={k} in {x(size)} filter {x(filt)} stride {x(stride)} dilation {x(dil)} pad {x(pad)}"


# ----------------------------------------------------------------------------------------------------------
# export (the GPU machine)


def _zoo() -> tuple:
    from convbw_mlir.torch.zoo import ZOO

    return ZOO


def _build(source: str, name: str, options: dict) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Zoo model ``name`` with random weights and its batch-2 input at the zoo's sizes (convbw_mlir.torch.zoo)."""
    from convbw_mlir.torch import zoo

    lib = zoo._import(source)
    model = zoo._build(source, name, lib)
    image, video = options.get("image", 224), options.get("video", (16, 112, 112))
    if source == "torchvision":
        x = torch.randn(2, 3, *video) if name in zoo._video_names(lib) else torch.randn(2, 3, image, image)
    elif source == "timm":
        x = torch.randn(2, 3, image, image)
    elif zoo._SPEECH[name][2] == "mel":
        model, x = model.get_encoder(), torch.randn(2, model.config.num_mel_bins, 3000)
    else:
        x = torch.randn(2, options.get("audio_samples", 16000))
    return model, (x,)


def export_one(source: str, name: str, options: dict, out: Path) -> dict[str, Any]:
    """Zoo model ``name``'s training step as ``out/<name>.pt2.gz``: its status, ``exported`` (with the file's size)
    or ``failed`` (with why), and the seconds it took."""
    from step_export import export_step

    start = time.perf_counter()
    try:
        model, inputs = _build(source, name, options)
        program = export_step(model, *inputs)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        path = out / f"{name}.pt2.gz"  # the graph's JSON compresses ~20x: the 44 models fit what travels back
        path.write_bytes(gzip.compress(buffer.getvalue()))
        entry = {"source": source, "status": "exported", "bytes": path.stat().st_size}
    except Exception as e:  # noqa: BLE001 - a model that does not export is named with why, not fatal
        entry = {"source": source, "status": "failed", "why": f"{type(e).__name__}: {_first_line(e)}"}
    entry["seconds"] = round(time.perf_counter() - start, 1)
    return entry


def export_zoo(out: Path, names: set[str] | None = None, jobs: int = 1, log=print) -> dict[str, Any]:  # noqa: ANN001
    """Each zoo model's training step as ``out/<model>.pt2.gz``, ``jobs`` models at a time (each in its own process
    where ``jobs`` > 1); returns (and writes as ``out/export.json``) each model's status."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"torch": torch.__version__, "models": {}}
    todo = [(s, n, o) for s, n, o in _zoo() if not names or n in names]
    if names and len(todo) < len(names):
        raise ValueError(f"--models: not in the zoo: {', '.join(sorted(names - {n for _, n, _ in todo}))}")
    with ProcessPoolExecutor(jobs) if jobs > 1 else _Inline() as pool:
        futures = {
            pool.submit(export_one, source, name, options, out): (source, name) for source, name, options in todo
        }
        for future in as_completed(futures):  # written as each finishes: a call cut short keeps what it had
            source, name = futures[future]
            try:
                entry = future.result()
            except Exception as e:  # noqa: BLE001 - the worker died (a crash in torch): that model failed
                entry = {
                    "source": source,
                    "status": "failed",
                    "why": f"{type(e).__name__}: {_first_line(e)}",
                    "seconds": 0,
                }
            report["models"][name] = entry
            log(f"{name}: {entry['status']} {entry.get('why', entry.get('bytes', ''))} ({entry['seconds']} s)")
            (out / "export.json").write_text(json.dumps(report, indent=1))
    return report


class _Inline:
    """A pool of one that runs each call as it is submitted (no child: a debugger and a traceback see it)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def submit(self, fn, *args):  # noqa: ANN001, ANN201
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(fn(*args))
        return future


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


# ----------------------------------------------------------------------------------------------------------
# count (here)


def expected_convs(program: Any) -> list[tuple[Key, dict]]:
    """Each ``aten.convolution_backward`` of ``program`` that computes a weight gradient: (its problem's key, the
    call's arguments to export it again alone)."""
    out = []
    for node in program.graph.nodes:
        if node.op != "call_function" or "convolution_backward" not in str(node.target):
            continue
        dy, x, w, _bias, stride, pad, dil, transposed, out_pad, groups, mask = node.args
        if not mask[1]:
            continue
        xs, ws = tuple(x.meta["val"].shape), tuple(w.meta["val"].shape)
        rank = len(ws) - 2
        k = ws[1] if transposed else ws[0] // groups  # a transposed convolution's weight is (C, K/G, ...)
        c = xs[1] // groups
        call = {"x": xs, "dy": tuple(dy.meta["val"].shape), "w": ws, "stride": list(stride), "pad": list(pad),
                "dilation": list(dil), "transposed": bool(transposed), "output_padding": list(out_pad),
                "groups": int(groups), "mask": [bool(m) for m in mask], "dtype": str(x.meta["val"].dtype)}  # fmt: skip
        key = _key(groups, xs[0], c, k, xs[2:], ws[2:], stride, dil, pad if len(pad) == rank else pad * rank)
        out.append((key, call))
    return out


def _extent(key: Key, pad_high: tuple | None = None) -> Key:
    """``key`` with its input size as the padded extent (input + low + high pads; a convolution's pads are symmetric):
    an explicit pad before a convolution (timm's "same" padding: ``F.pad`` then pad 0) is raised folded into the
    problem's pads, the same weight gradient as the convolution of the padded input the graph counts."""
    g, n, c, k, size, filt, stride, dil, pad = key
    high = pad if pad_high is None else pad_high
    return (g, n, c, k, tuple(s + lo + hi for s, lo, hi in zip(size, pad, high)), filt, stride, dil, pad)


def _raised_key(problem: Any) -> Key:
    return _extent(_key(problem.groups, problem.batch, problem.in_channels, problem.out_channels, problem.input_size,
                        problem.filter_size, problem.stride, problem.dilation, problem.pad_low),
                   tuple(problem.pad_high))  # fmt: skip


def match(expected: list[Key], raised: list[Key]) -> list[Key]:
    """The keys of ``expected`` no raised problem accounts for (as a multiset: two equal layers need two)."""
    left = Counter(raised)
    missing = []
    for key in expected:
        if left[key] > 0:
            left[key] -= 1
        else:
            missing.append(key)
    return missing


def _raise(linalg: str) -> tuple[list[Key], list[str]]:
    """``convbw-raise{remarks=true}`` on ``linalg``: the raised problems' keys and the remarks (one a contraction
    left alone)."""
    from convbw_mlir.dialects import convbw
    from convbw_mlir.passes import build_pass_manager, parse_pipeline
    from convbw_mlir.passes.framework import collect_ops

    from convbw_mlir.dispatch.module import _REMARK
    from convbw_mlir.ir_imports import ir, new_context

    remarks: list[str] = []

    def on_diagnostic(d: Any) -> bool:
        found = _REMARK.search(str(d.message))
        remarks.append(found.group(1) if found else str(d.message))
        return True

    with new_context() as ctx:
        handle = ctx.attach_diagnostic_handler(on_diagnostic)
        try:
            module = ir.Module.parse(linalg)
            build_pass_manager(parse_pipeline("convbw-raise{remarks=true}"), ctx).run(module.operation)
            return [_raised_key(convbw.problem_of(op)) for op in collect_ops(module.operation, convbw.OP_NAME)], remarks
        finally:
            handle.detach()


def _torch_ir(program: Any) -> str:
    """The torch IR of an already decomposed ``program`` (decomposing twice turns ``squeeze.dims`` into a prim
    torch.export refuses)."""
    from convbw_mlir.dispatch.module import import_frozen

    return import_frozen(program)


class _Alone(torch.nn.Module):
    def __init__(self, call: dict) -> None:
        super().__init__()
        self.args = (call["stride"], call["pad"], call["dilation"], call["transposed"], call["output_padding"],
                     call["groups"], [False, True, False])  # fmt: skip

    def forward(self, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution_backward(dy, x, w, None, *self.args)[1]


_WHY: dict[str, str] = {}  # a call's reason, once a run: equal layers (ResNets repeat theirs) compile once


def _why_alone(call: dict, timeout: float) -> str:
    """Why ``call``'s weight gradient is not raised: exported alone and raised; its remark, or that alone it is."""
    key = json.dumps({k: v for k, v in call.items() if k != "mask"}, sort_keys=True)
    if key not in _WHY:
        _WHY[key] = _why_alone_uncached(call, timeout)
    return _WHY[key]


def _why_alone_uncached(call: dict, timeout: float) -> str:
    from convbw_mlir.dispatch.module import input_phase

    dtype = getattr(torch, call["dtype"].removeprefix("torch."))
    tensors = [torch.zeros(call[k], dtype=dtype) for k in ("dy", "x", "w")]
    from convbw_mlir.dispatch.module import _decomposed

    program = _decomposed(torch.export.export(_Alone(call), tuple(tensors)))
    keys, remarks = _raise(input_phase(_torch_ir(program), isolate=True))
    if keys:
        return "raised when exported alone: in the model the linalg around it differs (not found)"
    return "; ".join(dict.fromkeys(remarks)) or "no contraction found (no remark)"


def count_model(path: Path, timeout: float = 600) -> dict[str, Any]:
    """The raise count of one exported training step: expected, raised, and each not raised with its reason."""
    from convbw_mlir.build.iree import compile_module as iree_compile
    from convbw_mlir.build.isolate import call as isolated
    from convbw_mlir.dispatch.module import _decomposed
    from convbw_mlir.ir_imports import ir, new_context
    from convbw_mlir.targets import resolve

    start = time.perf_counter()
    data = path.read_bytes()
    program = _decomposed(torch.export.load(io.BytesIO(gzip.decompress(data) if path.suffix == ".gz" else data)))
    expected = expected_convs(program)
    torch_ir = _torch_ir(program)
    calls = {_extent(key): (key, c) for key, c in expected}
    try:
        flags = ["--iree-input-type=torch", "--compile-to=input"]
        data = isolated(iree_compile, torch_ir, resolve("host"), flags, source_name="torch.mlir",
                        what=f"IREE's input phase of {path.name}", timeout=timeout)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - IREE refused the model: none of its convolutions reaches our pass
        why = f"IREE's input phase failed on the model: {type(e).__name__}: {_first_line(e)}"
        return {"expected": len(expected), "raised": 0, "raised_other": 0, "remarks": {}, "input_phase_failed": why,
                "not_raised": [{"problem": _describe(k), "call": c, "why": why} for k, c in expected],
                "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    with new_context():
        linalg = str(ir.Module.parse(data))
    raised, remarks = _raise(linalg)
    missing = match([_extent(key) for key, _ in expected], raised)
    not_raised = [{"problem": _describe(key), "call": call, "why": _why_alone(call, timeout)}
                  for key, call in (calls[k] for k in missing)]  # fmt: skip
    extra = len(raised) - (len(expected) - len(missing))  # raised contractions that are no counted convolution
    return {"expected": len(expected), "raised": len(expected) - len(missing), "raised_other": extra,
            "not_raised": not_raised, "remarks": dict(Counter(remarks)),
            "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


def count_dir(folder: Path, out: Path, names: set[str] | None = None, timeout: float = 600, log=print) -> dict:  # noqa: ANN001
    """Count every ``folder/*.pt2`` and ``*.pt2.gz``; write ``out/count.json`` and ``out/count.md``; return the
    json's dict."""
    exported = json.loads((folder / "export.json").read_text()) if (folder / "export.json").is_file() else {}
    report: dict[str, Any] = {"torch_export": exported.get("torch"), "torch_count": torch.__version__, "models": {}}
    for name, entry in exported.get("models", {}).items():
        if entry["status"] != "exported" and (not names or name in names):
            report["models"][name] = {"status": "not exported", "why": entry.get("why", "")}
    for path in sorted([*folder.glob("*.pt2"), *folder.glob("*.pt2.gz")]):
        name = path.name.split(".")[0]
        if names and name not in names:
            continue
        try:
            entry = {"status": "counted", **count_model(path, timeout)}
        except Exception as e:  # noqa: BLE001 - a model that does not load or import is named with why
            entry = {"status": "failed", "why": f"{type(e).__name__}: {_first_line(e)}"}
        report["models"][name] = entry
        log(f"{name}: {entry.get('raised', '-')}/{entry.get('expected', '-')} {entry.get('why', '')}")
        _write(report, out)
    _write(report, out)
    return report


def _totals(report: dict, imported_only: bool = False) -> tuple[int, int]:
    """(raised, expected) over the counted models (``imported_only``: those IREE's input phase took)."""
    counted = [m for m in report["models"].values() if m["status"] == "counted"]
    counted = [m for m in counted if not (imported_only and m.get("input_phase_failed"))]
    return sum(m["raised"] for m in counted), sum(m["expected"] for m in counted)


def _share(raised: int, expected: int) -> str:
    return f"{100 * raised / expected:.2f}%" if expected else "-"


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    raised, expected = _totals(report)
    report["raised"], report["expected"] = raised, expected
    report["raised_imported"], report["expected_imported"] = _totals(report, imported_only=True)
    (out / "count.json").write_text(json.dumps(report, indent=1) + "\n")
    models = report["models"].values()
    counted = sum(m["status"] == "counted" for m in models)
    imported, imported_of = report["raised_imported"], report["expected_imported"]
    taken = counted - sum(bool(m.get("input_phase_failed")) for m in models)
    lines = [
        "# The zoo's raise count (issue 41)", "",
        f"Exported with torch {report['torch_export']}, counted with torch {report['torch_count']} "
        "(bench/raise_zoo.py).", "",
        f"**{raised} of {expected} weight-gradient convolutions raised ({_share(raised, expected)})** in "
        f"{counted} models; in the {taken} models IREE's input phase takes: **{imported} of {imported_of} "
        f"({_share(imported, imported_of)})**.", "",
        "| model | raised | of | seconds | status |", "|---|---|---|---|---|",
    ]  # fmt: skip
    for name, m in report["models"].items():
        if m["status"] == "counted":
            status = "IREE's input phase failed (below)" if m.get("input_phase_failed") else "counted"
            lines.append(f"| {name} | {m['raised']} | {m['expected']} | {m['seconds']} | {status} |")
        else:
            lines.append(f"| {name} | - | - | - | {m['status']}: {m['why']} |")
    lines += ["", "## Not raised, by model and reason", ""]
    for name, m in report["models"].items():
        by_why: dict[str, list[str]] = {}
        for c in m.get("not_raised", []):
            by_why.setdefault(c["why"], []).append(f"{c['problem']} ({c['call']['dtype']})")
        for why, problems in by_why.items():
            shown = "; ".join(dict.fromkeys(problems[:5])) + (" ..." if len(problems) > 5 else "")
            lines.append(f"- {name}, {len(problems)} convolutions: {why}. E.g. {shown}")
    if lines[-1] == "":
        lines.append("none")
    (out / "count.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    e = sub.add_parser("export", help="the zoo's training steps as .pt2 (needs torchvision)")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--models", default="", help="comma-separated zoo model names (default: all)")
    e.add_argument("--jobs", type=int, default=1, help="models exported at a time, each in its own process")
    c = sub.add_parser("count", help="raise every .pt2 of DIR and count")
    c.add_argument("dir", type=Path)
    c.add_argument("--out", type=Path, default=HERE / "results" / "raise_zoo_2026-12-06")
    c.add_argument("--models", default="")
    c.add_argument("--timeout", type=float, default=600, help="seconds for one model's input phase")
    args = p.parse_args(argv)
    names = {n for n in args.models.split(",") if n} or None
    if args.verb == "export":
        if args.jobs < 1:
            p.error(f"--jobs: must be >= 1, got {args.jobs}")
        try:
            report = export_zoo(args.out, names, args.jobs)
        except ValueError as e:
            p.error(str(e))
        done = sum(m["status"] == "exported" for m in report["models"].values())
        print(f"exported {done} of {len(report['models'])} models to {args.out}")
        return 0
    if not args.dir.is_dir():
        p.error(f"dir: {args.dir} is not a folder")
    report = count_dir(args.dir, args.out, names, args.timeout)
    print(f"raised {report['raised']} of {report['expected']}; {args.out / 'count.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
