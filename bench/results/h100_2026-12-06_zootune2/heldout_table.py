"""heldout.md: every held-out problem of generalize.json with each selector's time over the best (run from the repo
root: .venv/bin/python bench/results/h100_2026-12-06_zootune2/heldout_table.py; reads results.json.xz)."""

import json
import lzma
from pathlib import Path

HERE = Path(__file__).parent
WHO = ("plan now", "learned", "nearest", "heuristic")


def main() -> None:
    report = json.loads((HERE / "generalize.json").read_text())
    results = json.loads(lzma.open(HERE / "results.json.xz").read())
    from convbw_mlir.dispatch.generalize import _times, is_held_out, read_models, read_split

    # generalize.evaluate's rows: the held-out rows with a timed candidate, in the results' order
    split, models = read_split("bench/zoo_split.json"), read_models("zoo")
    held = [r for r in results["problems"] if is_held_out(models.get(r["name"], []), split) and _times(r)]
    assert [r["name"] for r in held] == [e["name"] for e in report["rows"]]
    lines = ["| layer | type | best | µs | " + " | ".join(f"{w} / best" for w in WHO) + " |",
             "|---|---|---|---:|" + "---:|" * len(WHO)]  # fmt: skip
    for row, e in zip(held, report["rows"]):
        t = _times(row)
        best = t[e["best"]]
        cells = [f"**{t[e[w]] / best:.2f}**" if w in e and t[e[w]] / best > 1.1 else f"{t[e[w]] / best:.2f}"
                 if w in e else "not measured" for w in WHO]  # fmt: skip
        lines.append(f"| {e['name'].removesuffix('.n32')} | {row['problem']['dtype']} | {e['best']} | {best * 1e6:.2f} "
                     f"| " + " | ".join(cells) + " |")  # fmt: skip
    (HERE / "heldout.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
