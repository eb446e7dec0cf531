"""Pieces the explicit-kernel benchmarks share (``bench/explicit_{gemm,conv,streamk,wavespec}.py``): a
problem's manifest fields, the ``report`` subcommand, the tables written. Standard library only: the
scripts' run side imports it on the GPU machine (the checkout on ``PYTHONPATH``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def problem_fields(p: Any) -> dict[str, Any]:
    """The geometry a run side rebuilds the problem from (``p``: a ConvBwdWeightProblem), and its flops."""
    return {
        "images": p.batch,
        "groups": p.groups,
        "in_channels": p.in_channels,
        "out_channels": p.out_channels,
        "input_size": list(p.input_size),
        "output_size": list(p.output_size),
        "filter_size": list(p.filter_size),
        "stride": list(p.stride),
        "dilation": list(p.dilation),
        "pad": list(p.pad_low),
        "dw_dtype": p.dw_dtype,
        "flops": 2 * p.groups * p.out_channels * p.in_channels * math.prod(p.filter_size) * p.batch
        * math.prod(p.output_size),
    }  # fmt: skip


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """``report DIR ROWS --out OUT --device D [--date T]``: the tables again from a (cut-off) run's rows."""
    rep = sub.add_parser("report", help="tables from a (cut-off) run's rows.json")
    rep.add_argument("dir", type=Path)
    rep.add_argument("rows", type=Path)
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--device", required=True)
    rep.add_argument("--date", default=None)
    return rep


def write_tables(out: Path, stem: str, doc: dict[str, Any], lines: list[str]) -> int:
    """``OUT/<stem>.json`` (``doc``) and ``OUT/<stem>.md`` (``lines``), printed as well; returns 0."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


def geomean(values: list[float]) -> float | None:
    """The geometric mean, None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
