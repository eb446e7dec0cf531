"""Numbers the README and docs state, read back from the result files they name (issue 28, item 4).

Each row: the document, a pattern around the stated number (group ``n``), the result file the
document must link, and how that number follows from the file. A claim edited without its data, or
data replaced without its claim, fails here."""

from __future__ import annotations

import json
import lzma
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from convbw_mlir.suites import load_suite

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / path).read_text().splitlines() if line.strip()]


def _json(path: str):
    return json.loads((RESULTS / path).read_text())


def _isa(side: str, what: str) -> int:
    rows = _json("isa_2026-11-22_final.json")
    runs = [v for r in rows for k, v in r["res"].items() if k.endswith("/" + side)]
    return {"compiles": len(runs), "failed": sum(not v["ok"] for v in runs),
            "scratch": sum((v.get("scratch") or 0) > 0 for v in runs)}[what]  # fmt: skip


def _streamk(fixups: tuple[str, ...]) -> float:
    """Geomean of best split-K time / StreamK time (the best of ``fixups``) over the suite problems."""
    data = _json("h100_2026-11-23_streamk/explicit_streamk.json")
    us = {tuple(r["name"].split(":")): r["single_us"] for r in data["rows"]}
    ratios = []
    for problem in data["tiles"]:
        split = min(t for (c, p), t in us.items() if p == problem and c.startswith("splitk") and "_128x128" not in c)
        ratios.append(split / min(us[(f, problem)] for f in fixups if (f, problem) in us))
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


def _epilogue(kind: str, what: str) -> float:
    ratios = sorted(
        r[kind]["median_s"] / r["plain"]["median_s"] for r in _json("h100_2026-11-23_epilogue.json")["results"]
    )
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return {"median": median, "min": ratios[0], "max": ratios[-1]}[what]


def _fused_range(end: str) -> float:
    both = [_epilogue(k, end) for k in ("bilinear", "accumulate")]
    return min(both) if end == "min" else max(both)


def _layout4_strided_runs() -> int:
    """Layout-4 problems our explicit kernel ran on the H100 with a stride or dilation other than 1."""
    names = {r["name"].split(":")[1] for r in _json("h100_2026-11-23_explicit_conv.json")["rows"]
             if r["name"].startswith("ours:")}  # fmt: skip
    suite = dict(load_suite(ROOT / "convbw_mlir" / "suites" / "seeds.tsv"))
    suite.update(load_suite(ROOT / "convbw_mlir" / "suites" / "models.tsv"))
    assert names <= suite.keys(), names - suite.keys()
    return sum(any(s != 1 for s in suite[n].stride + suite[n].dilation) for n in names)


def _depthwise(rival: str) -> float:
    """Geomean of ``rival``'s kernel time over ours, over the depthwise problems where both are correct."""
    rows = _json("h100_2026-11-25_depthwise/run1_rows.json")
    us = {(r["kind"], r["problem"]): r["single_us"] for r in rows if r.get("correct")}
    ratios = [us[(rival, p)] / t for (kind, p), t in us.items() if kind == "ours" and (rival, p) in us]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


REMEASURE = "h100_2026-12-06_remeasure/run1/results"


def _remeasured(group: str, which: str, den: str, stat: str = "geomean") -> float:
    """cuDNN's kernel time over ``den``'s in the re-measure (bench/remeasure.py), over ``which`` of its problems:
    ``suite`` (hopper_conv.py's 13 dense layers, or explicit_conv.py's suite layers), ``held`` (the held-out
    2-D layers), ``ranked`` (the 1-D and 3-D layers)."""
    from conftest import bench_script

    hc = bench_script("hopper_conv")
    names = {"suite": set(hc.problems()) if group == "product" else
             set(hc.ec.problems()) - set(hc.ec.EXTRA), "held": set(hc.held_out()),
             "ranked": set(hc.ranked_problems())}[which]  # fmt: skip
    ratios = []
    for row in _json(f"{REMEASURE}/{group}.json")["problems"]:
        c = row["contenders"]
        if row["name"] in names and c.get(den, {}).get("status") == "ok" and c.get("cudnn", {}).get("status") == "ok":
            ratios.append(c["cudnn"]["kernel_s"] / c[den]["kernel_s"])
    assert len(ratios) == len(names)
    return min(ratios) if stat == "min" else math.exp(sum(map(math.log, ratios)) / len(ratios))


REMEASURE2 = "h100_2026-12-06_remeasure/run2/results"


def _remeasured2(group: str, num: str, den: str) -> float:
    """Geomean of ``num``'s kernel time over ``den``'s in run 2 of the re-measure, over the group's problems where
    both ran correct."""
    ratios = []
    for row in _json(f"{REMEASURE2}/{group}.json")["problems"]:
        c = row["contenders"]
        if c.get(num, {}).get("status") == "ok" and c.get(den, {}).get("status") == "ok":
            ratios.append(c[num]["kernel_s"] / c[den]["kernel_s"])
    assert ratios
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


CLASS_TABLE = "h100_2026-12-06_class_table"
# The thin class re-run with today's plan (the wgmma boxed form): its rows judge the class since.
CLASS_THIN = "h100_2026-12-06_classthin"
GEMV_FINAL = "h100_2026-12-06_gemv_final"


def _class_folder(cls: str) -> str:
    """The run whose rows judge ``cls`` now: the class's re-run where there is one, else the whole table."""
    return CLASS_THIN if cls == "thin" else CLASS_TABLE


def _class_table(cls: str, what: str) -> float:
    """A class's figure in issue 40's per-class table: bench/class_table.py's summary of the rows it committed."""
    from conftest import bench_script

    ct = bench_script("class_table")
    s = ct.class_summary([r for r in _jsonl(f"{_class_folder(cls)}/rows.jsonl") if r["class"] == cls])
    return s[what]


def _causal_roofline(dtype: str) -> float:
    """Mamba's causal conv: x + dy + dW bytes at the target table's sm_90a bandwidth, over our kernel time."""
    from convbw_mlir.targets import resolve

    row = next(r for r in _jsonl(f"{CLASS_TABLE}/rows.jsonl") if r["key"].endswith(f"mamba_causal_dw4_1d.{dtype}"))
    return row["bytes"] / (resolve("sm_90a").bandwidth_gbs * 1e9) / row["contenders"]["convbw"]["kernel_s"]


def _gemv_final_zoo(stat: str) -> float:
    """cuDNN over today's plan on the GEMV final round's zoo rows: where ``decide`` no longer gives the GEMV kernel,
    the time of the plan before it (timed beside it in that run)."""
    from conftest import bench_script

    from convbw_mlir.plan import decide

    gm = bench_script("gemv")
    probs = {(name, p.dtype): p for name, p, _ in gm.problems(["f16", "bf16"])}
    ratios = []
    for r in _json(f"{GEMV_FINAL}/results_zoo.json")["problems"]:
        c = r["contenders"]
        ours = c["convbw"]
        if gm.BEFORE in c and decide(probs[(r["name"], r["key"].rsplit(".", 1)[-1])], "sm_90a").gemv is None:
            ours = c[gm.BEFORE]
        ratios.append(c["cudnn"]["kernel_s"] / ours["kernel_s"])
    return min(ratios) if stat == "min" else math.exp(sum(map(math.log, ratios)) / len(ratios))


ZOOTUNE8 = "h100_2026-12-06_zootune8"


def _zootune8(what: str) -> float:
    """zootune8's tuning rate with both passes (its phases table) or the problems pass 2 re-timed (its results)."""
    if what == "rate":
        return round(next(iter(_json(f"{ZOOTUNE8}/phases.json").values()))["problems_per_minute_per_gpu"], 1)
    rows = json.loads(lzma.decompress((RESULTS / ZOOTUNE8 / "results.json.xz").read_bytes()))["problems"]
    return sum("pass2" in r for r in rows)


CLAIMS: list[tuple[str, str, str, Callable[[], float]]] = [
    ("README.md", r"are (?P<n>[\d.]+)x cuDNN on the suite's 13 dense layers", REMEASURE.split("/")[0],
     lambda: round(_remeasured("product", "suite", "ours90"), 2)),
    ("README.md", r"13 dense layers \(min (?P<n>[\d.]+)x\)", REMEASURE.split("/")[0],
     lambda: round(_remeasured("product", "suite", "ours90", "min"), 2)),
    ("README.md", r"(?P<n>[\d.]+)x on 12 held-out ones", REMEASURE.split("/")[0],
     lambda: round(_remeasured("product", "held", "ours90"), 2)),
    ("README.md", r"(?P<n>[\d.]+)x on 16 1-D/3-D ones", REMEASURE.split("/")[0],
     lambda: round(_remeasured("product", "ranked", "ours90"), 2)),
    ("README.md", r"(?P<n>[\d.]+)x cuDNN on the dense suite in layout 2", REMEASURE.split("/")[0],
     lambda: round(_remeasured("dense", "suite", "ours"), 2)),
    ("README.md", r"(?P<n>\d+) of 37 of our kernels read past", "h100_2026-11-23_torch/overread.jsonl",
     lambda: sum(not r["ok"] for r in _jsonl("h100_2026-11-23_torch/overread.jsonl"))),
    ("README.md", r"re-check has (?P<n>\d+) of 37 inside", "h100_2026-11-23_torch_recheck/overread.jsonl",
     lambda: sum(r["ok"] for r in _jsonl("h100_2026-11-23_torch_recheck/overread.jsonl"))),
    ("README.md", r"(?P<n>\d+) compiles,\s+840 ours", "isa_2026-11-22_final.json",
     lambda: _isa("ours", "compiles") + _isa("iree", "compiles")),
    ("README.md", r"\d+ compiles,\s+(?P<n>\d+) ours", "isa_2026-11-22_final.json", lambda: _isa("ours", "compiles")),
    ("README.md", r"default spills in (?P<n>\d+)", "isa_2026-11-22_final.json", lambda: _isa("iree", "scratch")),
    ("README.md", r"none of ours failing", "isa_2026-11-22_final.json",
     lambda: _isa("ours", "failed") + _isa("ours", "scratch")),
    ("README.md", r"(?P<n>[\d.]+)x \(bilinear\)", "h100_2026-11-23_epilogue.json",
     lambda: round(_epilogue("bilinear", "median"), 2)),
    ("README.md", r"(?P<n>[\d.]+)x \(accumulate\)", "h100_2026-11-23_epilogue.json",
     lambda: round(_epilogue("accumulate", "median"), 2)),
    ("README.md", r"(?P<n>[\d.]+)-[\d.]+x per problem", "h100_2026-11-23_epilogue.json",
     lambda: round(_fused_range("min"), 2)),
    ("README.md", r"[\d.]+-(?P<n>[\d.]+)x per problem", "h100_2026-11-23_epilogue.json",
     lambda: round(_fused_range("max"), 2)),
    ("README.md", r"against (?P<n>[\d.]+)x unfused", "h100_2026-11-23_epilogue.json",
     lambda: round(_epilogue("unfused", "median"), 2)),
    ("docs/results.md", r"IREE's default: (?P<n>\d+)\s+compiles", "isa_2026-11-22_final.json",
     lambda: _isa("ours", "compiles") + _isa("iree", "compiles")),
    ("docs/results.md", r"has scratch in (?P<n>\d+)", "isa_2026-11-22_final.json", lambda: _isa("iree", "scratch")),
    ("docs/explicit-kernels.md", r"geomean (?P<n>[\d.]+)x for the better of linear and tree",
     "h100_2026-11-23_streamk/explicit_streamk.json", lambda: round(_streamk(("streamk_linear", "streamk_tree")), 2)),
    ("docs/explicit-kernels.md", r"(?P<n>[\d.]+)x tree alone, 1.19x",
     "h100_2026-11-23_streamk/explicit_streamk.json", lambda: round(_streamk(("streamk_tree",)), 2)),
    ("docs/explicit-kernels.md", r"tree alone (?P<n>0\.\d{3})", "h100_2026-11-23_streamk/explicit_streamk.json",
     lambda: round(_streamk(("streamk_tree",)), 3)),
    ("docs/explicit-kernels.md", r"\((?P<n>0\.\d{3}): the better of linear and tree",
     "h100_2026-11-23_streamk/explicit_streamk.json", lambda: round(_streamk(("streamk_linear", "streamk_tree")), 3)),
    ("docs/epilogues.md", r"fused bilinear \(α = β = 2, D f16\) \| (?P<n>[\d.]+) \|", "h100_2026-11-23_epilogue",
     lambda: round(_epilogue("bilinear", "median"), 2)),
    ("docs/epilogues.md", r"fused accumulate \(into the caller's buffer\) \| (?P<n>[\d.]+) \|",
     "h100_2026-11-23_epilogue", lambda: round(_epilogue("accumulate", "median"), 2)),
    ("docs/epilogues.md", r"fused accumulate \(into the caller's buffer\) \| [\d.]+ \| [\d.]+-(?P<n>[\d.]+) \|",
     "h100_2026-11-23_epilogue", lambda: round(_epilogue("accumulate", "max"), 2)),
    ("docs/epilogues.md", r"fused bilinear \(α = β = 2, D f16\) \| [\d.]+ \| (?P<n>[\d.]+)-",
     "h100_2026-11-23_epilogue", lambda: round(_epilogue("bilinear", "min"), 2)),
    ("docs/explicit-kernels.md", r"faster on 15 of 15, 2.2x-10.0x, geomean (?P<n>[\d.]+)x", "h100_2026-11-25_depthwise",
     lambda: round(_depthwise("product"), 1)),
    ("docs/explicit-kernels.md", r"ours against cuDNN \| geomean (?P<n>[\d.]+)x over 20", "h100_2026-11-25_depthwise",
     lambda: round(_depthwise("cudnn"), 2)),
    ("docs/explicit-kernels.md", r"every one of them with stride 1 and dilation 1",
     "h100_2026-11-23_explicit_conv.json", _layout4_strided_runs),
    ("docs/timing.md", r"run 2: \*\*(?P<n>[\d.]+)x \([\d.]+-[\d.]+\)\*\* \([\d.]+x before\)", REMEASURE.split("/")[0],
     lambda: round(_remeasured2("first", "cudnn", "ours"), 2)),
    ("docs/timing.md", r"run 2: \*\*[\d.]+x \([\d.]+-[\d.]+\)\*\* \((?P<n>[\d.]+)x before\)", REMEASURE.split("/")[0],
     lambda: round(_remeasured2("first", "cudnn", "prev"), 2)),
    ("docs/timing.md", r"run 2, 4 of the 24: \*\*(?P<n>[\d.]+)x", REMEASURE.split("/")[0],
     lambda: round(_remeasured2("wavespec", "plain", "ws44"), 2)),
    ("docs/timing.md", r"run 2, 4 of the 24: \*\*[\d.]+x \([\d.-]+\), (?P<n>[\d.]+)x", REMEASURE.split("/")[0],
     lambda: round(_remeasured2("wavespec", "plain", "ws42"), 2)),
    ("docs/classes.md", r"ours reach \*\*(?P<n>[\d.]+) of it in f16", CLASS_TABLE,
     lambda: round(_causal_roofline("f16"), 2)),
    ("docs/classes.md", r"and (?P<n>[\d.]+) in bf16 \(met\)", CLASS_TABLE, lambda: round(_causal_roofline("bf16"), 2)),
    ("docs/classes.md", r"\| dw \| 19 \(38\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 0 \| (?P<n>[\d.]+) \|",
     CLASS_TABLE,
     lambda: round(_class_table("dw", "f16_over_bf16"), 3)),
    ("docs/timing.md", r"\*\*(?P<n>[\d.]+) problems a minute a GPU with both passes\*\*", ZOOTUNE8,
     lambda: _zootune8("rate")),
    ("docs/timing.md", r"and re-timed (?P<n>\d+) in pass 2", ZOOTUNE8, lambda: _zootune8("pass2")),
    ("docs/decisions.md", r"zoo 0\.70 -> \*\*(?P<n>[\d.]+)\*\*", GEMV_FINAL,
     lambda: round(_gemv_final_zoo("geomean"), 2)),
    ("docs/decisions.md", r"zoo 0\.70 -> \*\*[\d.]+\*\* \(min (?P<n>[\d.]+)\)", GEMV_FINAL,
     lambda: round(_gemv_final_zoo("min"), 2)),
    *[("docs/classes.md", rf"\| {c} \| \d+ \(\d+\) \| (?P<n>[\d.]+) \|", _class_folder(c),
       lambda c=c: round(_class_table(c, "geomean"), 2))
      for c in ("first", "conv1d", "conv3d", "dw", "thin", "medium", "gemv", "dense")],
    *[("docs/classes.md", rf"\| {c} \| \d+ \(\d+\) \| [\d.]+ \| (?P<n>[\d.]+) \|", _class_folder(c),
       lambda c=c: round(_class_table(c, "min"), 2))
      for c in ("first", "conv1d", "conv3d", "dw", "thin", "medium", "gemv", "dense")],
    *[("README.md", rf"{label} (?P<n>[\d.]+)x", _class_folder(c), lambda c=c: round(_class_table(c, "geomean"), 2))
      for c, label in (("first", "first layers"), ("conv1d", "1-D"), ("conv3d", "3-D"), ("dw", "depthwise"),
                       ("thin", "thin groups"), ("medium", "medium groups"), ("gemv", "GEMV-like"),
                       ("dense", "dense"))],
]  # fmt: skip


@pytest.mark.parametrize(("doc", "pattern", "result", "value"), CLAIMS, ids=[f"{c[0]}:{c[1][:40]}" for c in CLAIMS])
def test_claim_states_the_number_of_the_result_file_it_links(doc, pattern, result, value):
    text = " ".join((ROOT / doc).read_text().split())  # a claim may wrap
    found = re.search(pattern, text)
    assert found, f"{doc}: no claim matching {pattern!r}"
    assert result in text, f"{doc} states {found.group(0)!r} without naming {result}"
    stated = float(found.group("n")) if "n" in found.groupdict() else 0  # a sentence without a number: none
    assert value() == pytest.approx(stated), f"{doc}: {found.group(0)!r}, but {result} gives {value()}"
