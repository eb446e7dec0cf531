"""bench/amd_estimate.py's inputs: the emulator's counts (matrix instructions, global and LDS bytes, LDS
bank conflicts) against what the kernel's tiling says they must be, the bank-conflict model on access
patterns whose answer is known, and one problem estimated end to end (ours against IREE's kernel)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from amd_emulator import Counts, emulate

from convbw_mlir.plan import decide, explicit_tiling
from convbw_mlir.problem import ConvBwdWeightProblem as P

pytest.importorskip("iree.compiler")

GEMM = P(1, 1, 256, 128, (8, 8), (1, 1), layout=4, dw_dtype="f32")  # M = 128, N = 256, reduction 64: 2 k tiles


def _lds(lanes: int, stride: int, width: int, banks: int = 32) -> Counts:
    """One wave access: lane l at byte ``l * stride``, ``width`` bytes each."""
    c = Counts(banks=banks)
    c.lds(np.arange(lanes), np.arange(lanes) * stride, width)
    return c


def test_bank_model_counts_known_patterns() -> None:
    # 16-byte reads of rows 80 B apart (40 f16): 8 lanes a clock touch banks 0,20,8,28,16,4,24,12 (+3): no conflict
    assert (_lds(64, 80, 16).lds_cycles, _lds(64, 80, 16).lds_ideal_cycles) == (8, 8)
    # 8-byte reads of the same rows: 16 lanes a clock, rows 0 and 8 both start at bank 0 (160 dwords apart)
    assert (_lds(64, 80, 8).lds_cycles, _lds(64, 80, 8).lds_ideal_cycles) == (8, 4)
    assert _lds(64, 128, 4).lds_cycles == 2 * 32  # 4-byte reads 128 B apart: every lane of a clock on one bank
    assert _lds(64, 0, 4).lds_cycles == 2  # one dword for all lanes: a broadcast
    assert _lds(32, 8, 8, banks=64).lds_cycles == 1  # RDNA 3's 64 banks: 32 contiguous lanes of 8 B in one clock
    assert _lds(32, 80, 8, banks=64).lds_cycles == 2  # rows 80 B apart: lanes 0 and 16 meet (320 dwords apart)


@pytest.mark.parametrize(("target", "waves", "lds_reads_per_tile"), [("gfx942", 8, 49152), ("gfx1100", 8, 98304)])
def test_emulated_counts_are_the_tilings_arithmetic(target: str, waves: int, lds_reads_per_tile: int) -> None:
    plan = decide(GEMM, target, strategy="explicit")
    t = explicit_tiling(plan)
    c = Counts(banks=32 if target == "gfx942" else 64)
    emulate(GEMM, target, plan=plan, blocks=[(0, 0, 0)], counts=c)
    ktiles = 64 // t.bk
    per_wave = t.bm * t.bn * t.bk // waves // (16 * 16 * 16)  # 16x16x16 instructions: the tile over 8 waves
    assert c.mma == ktiles * waves * per_wave
    # each k tile loaded once and staged in LDS, plus one: the prefetch of the last iteration reloads the last
    # tile (gemm_cdna clamps the next tile's index instead of branching)
    assert c.global_load_bytes == (ktiles + 1) * (t.bm + t.bn) * t.bk * 2 == c.lds_write_bytes
    assert c.lds_read_bytes == ktiles * lds_reads_per_tile  # RDNA 3 reads A and B in both half-waves: twice CDNA's
    assert c.global_store_bytes == t.bm * t.bn * 4  # the f32 result, once
    assert c.lds_cycles >= c.lds_ideal_cycles > 0


def test_estimate_ranks_ours_against_irees_kernel_on_one_problem() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from amd_estimate import iree, ours, table

    problem = P.from_ck("2 1 2 36 256 3 3 7 7 1 1 1 1 1 1 1 1", layout=4)  # retina_k36_7
    o, i = ours(problem, "gfx942"), iree(problem, "gfx942")
    assert o.time > 0 and i.time > 0
    assert o.main.bound in ("matrix", "LDS", "DRAM", "cache") and i.main.bound in o.main.t
    # ours: 2 x 18 tiles of 128x128 over K = 36 rows (M padded to 128), 4 k tiles of 32 over 98 positions
    assert o.main.mma == 18 * 4 * 8 * 16
    assert o.main.flops >= o.useful_flops and i.main.flops >= i.useful_flops  # padding only adds work
    assert o.main.conflict >= 1.0
    text = table([("retina_k36_7", "gfx942", o, i, "")], ["gfx942"])
    assert "| retina_k36_7 |" in text and f"{i.time / o.time:.2f}" in text


def test_docs_state_what_the_committed_estimate_says() -> None:
    import math
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "bench/results/amd_estimate_2026-11-25.md").read_text()
    docs = (root / "docs/explicit-kernels.md").read_text()
    said = {}
    for target, section in re.findall(r"### (gfx\d+) \(.*?\)\n(.*?)(?=\n### |\Z)", text, re.S):
        rows = [r.split("|") for r in section.splitlines() if r.startswith("| ") and "problem" not in r]
        ratios = [float(r[4]) for r in rows]
        bounds = [re.search(r"\((\w+)\)", r[2]).group(1) for r in rows]
        said[target] = (sum(v > 1 for v in ratios), len(rows), math.exp(sum(map(math.log, ratios)) / len(rows)),
                        bounds.count("LDS"), bounds.count("matrix"))  # fmt: skip
    (a, n, g, lds, _), (b, m, h, _, mat) = said["gfx942"], said["gfx1100"]
    assert f"ranks ours ahead on {a} of {n} problems on MI300X (geometric\nmean {g:.2f}x)" in docs
    assert f"and {b} of {m} on RX 7900 XTX ({h:.2f}x)" in docs
    assert f"**LDS on MI300X** ({lds} of {n})" in docs and f"**the matrix rate on RX 7900 XTX** ({mat} of {m})" in docs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--targets", "gfx90a"], "--targets: gfx90a is not one of gfx942, gfx1100\n"),
        (["--only", "nope"], "--only: nope is not a 2-D dense suite problem\n"),
        (["--out", "."], "--out: . is a folder, not a file\n"),
    ],
)
def test_estimate_cli_refuses_bad_arguments_with_one_line(args, message, capsys) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from amd_estimate import main

    assert main(args) == 1
    assert capsys.readouterr().err == message
