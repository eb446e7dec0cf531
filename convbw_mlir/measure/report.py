"""Table and plot from benchmark results: ``python -m convbw_mlir.measure.report results.json``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

__all__ = ["accuracy", "geomean", "strategy_cell", "summarize", "write_report"]

IREE_DEFAULTS = ("iree_direct", "iree_torch")


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _t(row: dict, name: str) -> float | None:
    r = row["contenders"].get(name, {})
    return r.get("median_s") if r.get("status") == "ok" else None


def best_iree_default(row: dict) -> float | None:
    times = [t for t in (_t(row, n) for n in IREE_DEFAULTS) if t]
    return min(times) if times else None


def summarize(results: dict) -> dict:
    """Speedups of convbw over the better IREE default and over cuDNN, per problem and geomean."""
    vs_iree, vs_cudnn_dense, vs_cudnn_grouped, rows = [], [], [], []
    for row in results["problems"]:
        ours = _t(row, "convbw")
        base = best_iree_default(row)
        cud = _t(row, "cudnn")
        s_iree = base / ours if ours and base else None
        s_cud = cud / ours if ours and cud else None
        if s_iree:
            vs_iree.append(s_iree)
        if s_cud:
            (vs_cudnn_grouped if row.get("depthwise_or_grouped") else vs_cudnn_dense).append(s_cud)
        rows.append((row, ours, base, cud, s_iree, s_cud))
    return {
        "rows": rows,
        "geomean_vs_iree": geomean(vs_iree),
        "min_vs_iree": min(vs_iree) if vs_iree else None,
        "geomean_vs_cudnn_dense": geomean(vs_cudnn_dense),
        "geomean_vs_cudnn_grouped": geomean(vs_cudnn_grouped),
    }


def _fmt(v: float | None, scale: float = 1e6, digits: int = 1) -> str:
    return f"{v * scale:.{digits}f}" if v else "-"


def strategy_cell(config: dict) -> str:
    """Our kernel's strategy and tiling as the plan has them: ``explicit 128x256x64 (2x4 subgroups, 3 stages)``
    (m out channels x n in channels x k reduction step), StreamK's workgroups and fixup, producer warps, groups
    merged into one GEMM."""
    strategy = config.get("strategy")
    if not strategy:
        return "-"
    cell = str(strategy)
    if all(f in config for f in ("m", "n", "k")):
        cell += f" {config['m']}x{config['n']}x{config['k']}"
        sub = f"{config['subgroups_m']}x{config['subgroups_n']} subgroups" if "subgroups_m" in config else ""
        more = [s for s in (sub, f"{config['stages']} stages" if "stages" in config else "") if s]
        cell += f" ({', '.join(more)})" if more else ""
    if "streamk" in config:
        cell += f", StreamK {config['streamk'].get('workgroups')} workgroups {config['streamk'].get('fixup', '')}"
    if "producers" in config:
        cell += f", {config['producers']} producer warps"
    if "merge" in config:
        cell += f", {config['merge']} groups merged"
    return cell.rstrip()


def markdown(results: dict) -> str:
    s = summarize(results)
    lines = [
        f"# convbw-mlir on {results['device']} ({results['target']} code), {results['date']}",
        "",
        f"IREE {results['iree_version']}. Times in µs (median); TFLOP/s of convbw; speedup = contender time / "
        "convbw time; roof = fraction of the roofline max(flops/peak, bytes/bandwidth) convbw reaches. "
        "WRONG = result failed the float64 check (never counted as a win); crashed = the kernel faulted "
        "the device or killed its process (the problem's other contenders ran in a fresh process).",
        "",
        "| problem | convbw µs | TFLOP/s | roof | IREE direct µs | IREE torch µs | IREE+fusilli µs | cuDNN µs "
        "| vs IREE default | vs cuDNN | k_batch | strategy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict, name: str) -> str:
        r = row["contenders"].get(name, {})
        return _fmt(r.get("median_s")) if r.get("status") == "ok" else r.get("status", "-")

    for row, ours, _base, _cud, s_iree, s_cud in s["rows"]:
        cfg = row["contenders"].get("convbw", {}).get("config", {})
        tflops = f"{row['flops'] / ours / 1e12:.2f}" if ours else "-"
        roof = f"{row['roofline_s'] / ours:.2f}" if ours and row.get("roofline_s") else "-"
        lines.append(
            f"| {row['key']} | {cell(row, 'convbw')} | {tflops} | {roof} | {cell(row, 'iree_direct')} "
            f"| {cell(row, 'iree_torch')} "
            f"| {cell(row, 'iree_fusilli')} | {cell(row, 'cudnn')} | {_fmt(s_iree, 1, 2)} | {_fmt(s_cud, 1, 2)} "
            f"| {cfg.get('k_batch', '-')} | {strategy_cell(cfg)} |"
        )
    lines += [
        "",
        f"- geomean speedup vs the better IREE default: {_fmt(s['geomean_vs_iree'], 1, 2)} "
        f"(worst {_fmt(s['min_vs_iree'], 1, 2)})",
        f"- geomean vs cuDNN, dense (G=1): {_fmt(s['geomean_vs_cudnn_dense'], 1, 2)}; "
        f"grouped and depthwise: {_fmt(s['geomean_vs_cudnn_grouped'], 1, 2)}",
    ]
    wrong = [
        (row["key"], n)
        for row in results["problems"]
        for n, r in row["contenders"].items()
        if r.get("status") == "WRONG"
    ]
    lines.append(f"- wrong results: {', '.join(f'{k} ({n})' for k, n in wrong) if wrong else 'none'}")
    crashed = [
        f"{row['key']} ({n}: {r.get('error', '')})"
        for row in results["problems"]
        for n, r in row["contenders"].items()
        if r.get("status") == "crashed"
    ]
    lines.append(f"- crashed: {'; '.join(crashed) if crashed else 'none'}")
    return "\n".join(lines) + "\n" + accuracy(results)


def _err(r: dict) -> str:
    """A result's worst error against float64: RMS units, ulps of its type, and the verdict where not ok."""
    if "error_rms" not in r:
        return r.get("status", "-")
    cell = f"{r['error_rms']:.2g} ({r['error_ulps']:.3g} ulp)"
    return cell if r.get("status") == "ok" else f"**{r.get('status')}** {cell}"


def accuracy(results: dict) -> str:
    """Per problem: the GPU reference's check and every result's worst error against float64."""
    names = ["convbw", "iree_direct", "iree_torch", "iree_fusilli", "cudnn"]
    lines = [
        "",
        "## Accuracy against float64",
        "",
        "Worst error of a random sample of dW entries against float64 (`error_rms`: in units of the RMS of dW; "
        "ulp: of dW's type at max(|dW|, RMS)). Tolerance: one rounding to dW's type plus 8 standard deviations of "
        "f32 accumulation over the reduction length L (docs/tolerances.md); the reference column's is its own "
        "(f32, round to nearest where it has no matrix instructions). Results are also checked whole against "
        "the numpy reference or the GPU reference (`checked against`).",
        "",
        "| problem | L | checked against | GPU reference (f32) | " + " | ".join(names) + " | tolerance (RMS) |",
        "|---|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for row in results["problems"]:
        ref = row.get("reference_check", {})
        tol = next((r["tolerance_rms"] for r in row["contenders"].values() if "tolerance_rms" in r), None)
        against = row.get("reference_checked", "") or "-"
        if against.startswith("GPU reference WRONG"):
            against = "float64 sample only"
        elif against.startswith("float64 sample"):
            against = "GPU reference"
        ref_cell = _err(ref) if ref else f"failed: {row.get('reference_error', '-')}"[:80]
        cells = [_err(row["contenders"].get(n, {})) for n in names]
        lines.append(
            f"| {row['key']} | {row.get('reduction_length', '-')} | {against} | {ref_cell} | "
            + " | ".join(cells)
            + f" | {f'{tol:.2g}' if tol else '-'} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> bool:
    """TFLOP/s per problem for each contender, with the roofline; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = results["problems"]
    names = ["convbw", "iree_direct", "iree_torch", "iree_fusilli", "cudnn"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.35), 5))
    xs = range(len(rows))
    for name in names:
        ys = [(r["flops"] / t / 1e12) if (t := _t(r, name)) else float("nan") for r in rows]
        ax.plot(xs, ys, "o", label=name, markersize=4)
    roof = [r["flops"] / r["roofline_s"] / 1e12 if r.get("roofline_s") else float("nan") for r in rows]
    ax.plot(xs, roof, "k_", label="roofline", markersize=10)
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["key"] for r in rows], rotation=90, fontsize=6)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"conv bwd-weight on {results['device']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(results: dict, json_path: str | Path) -> None:
    json_path = Path(json_path)
    json_path.with_suffix(".md").write_text(markdown(results))
    plot(results, json_path.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m convbw_mlir.measure.report results.json", file=sys.stderr)
        return 1
    from convbw_mlir.jsonio import read_json, require_fields

    path = Path(argv[0])
    try:
        results = require_fields(read_json(path, "results"), {"problems": list}, f"results {path}")
        write_report(results, path)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyError, TypeError) as e:  # a row without a field the table reads
        print(f"error: results {path}: not a benchmark results file ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    print(f"wrote {path.with_suffix('.md')} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
