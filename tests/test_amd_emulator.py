"""The AMD kernel's numerics on the CPU: ``tests/amd_emulator.py`` runs its IR (gfx942 MFMA, gfx1100 RDNA 3
WMMA, gfx1200 RDNA 4 WMMA) against float64, with the lane maps checked equal to the tables AMD's matrix
instruction calculator prints (tests/data/amd_lane_maps), and LDS races caught; layouts 4 and 2
(NHWGC/GKYXC/NHWGK), f16 and bf16.

``make emulate-amd`` runs every dense suite problem (tests/emulate_amd.py); these are the small ones."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from amd_emulator import LANE_MAPS, LdsRace, _AmdBlock, _Group, emulate
from convbw_mlir.passes.framework import collect_ops

from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels import gemm_cdna, gemm_rdna
from convbw_mlir.problem import ConvBwdWeightProblem as P

MAPS = Path(__file__).parent / "data" / "amd_lane_maps"
TARGETS = ("gfx942", "gfx1100", "gfx1200")
RAGGED = "2 1 2 36 16 3 3 7 7 2 2 1 1 1 1 1 1"  # K = 36, stride 2, padding: every edge ragged

# calculator file -> (emulator map, matrix) ; C and D share registers
_MAP_OF = {"16x16x16": "mfma_16x16x16", "32x32x8": "mfma_32x32x8"}


def _emulator_map(path: Path) -> tuple[str, int]:
    """(LANE_MAPS key, subword) of a calculator table: subword 0/1 for RDNA 3's f16 result halves."""
    arch, inst = path.parent.name, path.name.split(".")[0]
    if "wmma" in inst:
        return f"wmma_{arch}", 1 if "opsel4" in path.name else 0
    return next(v for k, v in _MAP_OF.items() if k in inst), 0


def _element(column: str, f16_d_rdna3: bool, subword: int) -> int:
    """The vector element a calculator column (``v3.[31:16]``, ``v5``) is: 16-bit types pack two a register."""
    reg, bits = re.fullmatch(r"v(\d+)(?:\.\[(\d+):\d+\])?", column).groups()
    if bits is None:
        return int(reg)
    half = 1 if bits == "31" else 0
    if f16_d_rdna3:
        assert half == subword  # OPSEL picks one half of every register
        return int(reg)  # element e of the 8 results is register e (emulator: vector element 2e + subword)
    return 2 * int(reg) + half


@pytest.mark.parametrize("path", sorted(MAPS.glob("*/*.csv")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_emulator_lane_maps_equal_the_tables_amds_calculator_prints(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# python matrix_calculator.py --architecture ")  # the command that made it
    header = next(i for i, ln in enumerate(lines) if ln.startswith("lane,"))
    columns = lines[header].split(",")[1:]
    name, subword = _emulator_map(path)
    lm = LANE_MAPS[name]
    matrix = path.name.split(".")[1]
    want = {"A": lm.a, "B": lm.b, "C": lm.d, "D": lm.d}[matrix]
    f16_d = "v_wmma_f16" in path.name and name == "wmma_rdna3"
    rows = [ln.split(",") for ln in lines[header + 1 :]]
    assert len(rows) == lm.wave and len(columns) == want.shape[1]
    for row in rows:
        lane = int(row[0])
        for col, cell in zip(columns, row[1:]):
            i, j = map(int, re.fullmatch(rf"{matrix}\[(\d+)\]\[(\d+)\]", cell).groups())
            assert tuple(want[lane, _element(col, f16_d, subword)]) == (i, j), f"lane {lane} {col}"


def _table(path: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """(lane, register column index) -> (i, j) of one calculator table."""
    lines = path.read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("lane,"))
    out = {}
    for ln in lines[header + 1 :]:
        lane, *cells = ln.split(",")
        for c, cell in enumerate(cells):
            out[int(lane), c] = tuple(map(int, re.findall(r"\[(\d+)\]", cell)))
    return out


@pytest.mark.parametrize(
    ("op", "arch", "inst", "a_len", "acc"),
    [("mfma", "cdna3", "v_mfma_f32_16x16x16_f16", 4, "vector<4xf32>"),
     ("mfma", "cdna3", "v_mfma_f32_32x32x8_f16", 4, "vector<16xf32>"),
     ("mfma", "cdna3", "v_mfma_f32_32x32x8_bf16", 4, "vector<16xf32>"),
     ("wmma", "rdna3", "v_wmma_f32_16x16x16_f16", 16, "vector<8xf32>"),
     ("wmma", "rdna4", "v_wmma_f32_16x16x16_f16", 8, "vector<8xf32>"),
     ("wmma", "rdna4", "v_wmma_f32_16x16x16_bf16", 8, "vector<8xf32>")],
)  # fmt: skip
def test_each_matrix_instruction_computes_a_times_b_plus_c_laid_out_as_amds_tables(op, arch, inst, a_len, acc):
    """Operands placed and the result read by the calculator's tables themselves (16-bit: two a register)."""
    m, n, k = map(int, re.search(r"(\d+)x(\d+)x(\d+)", inst).groups())
    wave = 64 if op == "mfma" else 32
    rng = np.random.default_rng(0)
    A, B, C = (rng.integers(-3, 4, s).astype(np.float64) for s in ((m, k), (k, n), (m, n)))
    tables = {x: _table(MAPS / arch / f"{inst}.{x}.csv") for x in "ABCD"}
    acc_len = int(re.search(r"<(\d+)x", acc).group(1))
    a = np.zeros((wave, a_len), np.float16)
    b = np.zeros((wave, a_len), np.float16)
    c = np.zeros((wave, acc_len), np.float32)
    for (lane, col), (i, j) in tables["A"].items():
        a[lane, col] = A[i, j]
    for (lane, col), (i, j) in tables["B"].items():
        b[lane, col] = B[i, j]
    for (lane, col), (i, j) in tables["C"].items():
        c[lane, col] = C[i, j]
    d = np.full((wave, acc_len), np.nan, np.float32)
    ab = f"vector<{a_len}x{inst.rsplit('_', 1)[1]}>"  # f16 or bf16 (the values are small integers: exact)
    _run_func(
        f"""func.func @k(%a: {ab}, %b: {ab}, %c: {acc}, %d: memref<{wave}x{acc_len}xf32>) {{
              %c0 = arith.constant 0 : index
              %lane = gpu.thread_id x
              %r = amdgpu.{op} {m}x{n}x{k} %a * %b + %c : {ab}, {ab}, {acc}
              vector.store %r, %d[%lane, %c0] : memref<{wave}x{acc_len}xf32>, {acc}
              return
            }}""",
        [a, b, c, d],
        wave,
    )  # fmt: skip
    want = A @ B + C
    for (lane, col), (i, j) in tables["D"].items():
        assert d[lane, col] == want[i, j], f"lane {lane} register {col}: D[{i}][{j}]"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("ck", "options"),
    [
        (RAGGED, {}),  # gathered B, zero-filled padding, rows past M and columns past N masked
        ("2 1 3 40 24 1 1 6 6 1 1 1 1 0 0 0 0", {"k_batch": 2}),  # plain 1x1 GEMM, 4-element loads, split in 2
        ("2 2 3 20 16 3 3 9 9 1 1 2 2 1 1 1 1", {"k_batch": 3}),  # 2 groups, dilation 2, 3 splits (one tile short)
        ("2 1 3 16 8 3 3 10 10 2 2 1 1 0 0 0 0", {}),  # stride 2, no padding, ragged reduction (75)
    ],
)  # fmt: skip
def test_amd_kernel_matches_float64_under_emulation_and_stores_each_output_once(target, ck, options):
    from convbw_mlir.plan import decide

    p = P.from_ck(ck, layout=4)
    e = emulate(p, target, plan=decide(p, target, strategy="explicit", **options))
    assert e.error() < 2e-3
    assert (e.counts == 1).all()  # every dW entry (or split partial) stored once, nothing past M or N


TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 8e-3}  # of the largest entry: dW's rounding (bf16: 2^-8)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("ck", "layout", "dtype", "options"),
    [
        (RAGGED, 2, "f16", {}),  # NHWGC: stride 2, padding, K = 36 of 128 (4-channel loads), N and r ragged
        (RAGGED, 2, "bf16", {}),
        (RAGGED, 4, "bf16", {}),  # bf16 in layout 4: gathered x element by element
        ("2 2 3 20 24 3 3 9 9 1 1 2 2 1 1 1 1", 2, "bf16", {"k_batch": 3}),  # 2 groups, dilation 2, 3 splits
        ("2 1 3 40 24 1 1 6 6 1 1 1 1 0 0 0 0", 2, "f16", {"k_batch": 2}),  # plain 1x1 GEMM, split in 2
        ("2 1 3 7 5 3 3 6 6 1 1 1 1 1 1 1 1", 2, "bf16", {}),  # odd K and C: one channel a load
    ],
)  # fmt: skip
def test_layout_2_and_bf16_match_float64_under_emulation_and_store_each_output_once(target, ck, layout, dtype,
                                                                                     options):  # fmt: skip
    from convbw_mlir.plan import decide

    p = P.from_ck(ck, layout=layout, dtype=dtype)
    for dw in (dtype, "f32"):
        q = p.with_(dw_dtype=dw)
        e = emulate(q, target, plan=decide(q, target, strategy="explicit", **options))
        assert e.error() < TOLERANCE[dw], dw
        assert (e.counts == 1).all()


@pytest.mark.parametrize("target", ["gfx90a", "gfx950", "gfx1151", "gfx1201"])
@pytest.mark.parametrize(("layout", "dtype"), [(4, "f16"), (2, "bf16")])
def test_the_other_amd_targets_of_the_table_match_float64_under_emulation(target, layout, dtype):
    p = P.from_ck(RAGGED, layout=layout, dtype=dtype).with_(dw_dtype="f32")  # dW in f32: no rounding
    e = emulate(p, target)
    assert e.error() < 1e-5 and (e.counts == 1).all()


@pytest.mark.parametrize(
    ("target", "forms", "wrong"),
    [("gfx942", gemm_cdna.FORMS, {"acc_row": (1, 4)}),  # D rows (l / 16) + 4e instead of AMD's 4(l / 16) + e
     ("gfx1200", gemm_rdna.FORMS, {"acc_row": (1, 2)})],  # RDNA 3's result rows on RDNA 4
)  # fmt: skip
@pytest.mark.parametrize(("layout", "dtype"), [(4, "f16"), (2, "bf16")])
def test_a_kernel_form_with_another_lane_map_is_wrong_under_emulation(monkeypatch, target, forms, wrong, layout,
                                                                      dtype):  # fmt: skip
    name = f"{'MFMA' if target == 'gfx942' else 'WMMAR4'}_F32_16x16x16_{dtype.upper()}"
    monkeypatch.setitem(forms, name, forms[name].__class__(**{**vars(forms[name]), **wrong}))
    assert emulate(P.from_ck(RAGGED, layout=layout, dtype=dtype), target).error() > 0.1


def test_rdna3_operands_not_repeated_in_both_half_waves_are_refused(monkeypatch):
    r3 = gemm_rdna.FORMS["WMMAR3_F32_16x16x16_F16"]
    # lanes 16-31 reading the next 16 k instead of repeating lanes 0-15 (the layout RDNA 3 does not have)
    monkeypatch.setitem(gemm_rdna.FORMS, r3.intrinsic, r3.__class__(**{**vars(r3), "k_lanes": 16}))
    with pytest.raises(AssertionError, match="RDNA 3 repeats A and B in both half-waves"):
        emulate(P.from_ck(RAGGED, layout=4), "gfx1100")


def _drop_barrier(which: str):
    """A mutation: erase the prologue's barrier or the k loop's."""

    def mutate(fn) -> None:
        barriers = collect_ops(fn, "gpu.barrier")
        in_loop = [b for b in barriers if b.parent.name == "scf.for"]
        outside = [b for b in barriers if b.parent.name != "scf.for"]
        (victim,) = in_loop if which == "loop" else outside
        victim.erase()

    return mutate


@pytest.mark.parametrize(("target", "layout"), [("gfx942", 4), ("gfx1200", 4), ("gfx1100", 2)])
@pytest.mark.parametrize(
    ("which", "message"),
    [("loop", r"reads LDS element \(1, .* that wave \d+ wrote"),  # tile 1 read while other waves store it
     ("prologue", r"reads LDS element \(0, .* that wave \d+ wrote")],  # tile 0 read before every wave stored it
)  # fmt: skip
def test_a_removed_barrier_is_caught_as_an_lds_race(target, layout, which, message):
    p = P.from_ck("2 1 2 36 16 3 3 9 9 1 1 1 1 1 1 1 1", layout=layout)
    with pytest.raises(LdsRace, match=message):
        emulate(p, target, mutate=_drop_barrier(which))


def test_lds_race_check_catches_a_write_over_what_another_wave_read_and_forgets_at_a_barrier():
    from amd_emulator import _Lds

    lds = _Lds((2, 8))
    lds.access(0, np.array([3]), write=False)
    lds.access(0, np.array([3]), write=True)  # its own read: program order within a wave
    lds.reset()  # a barrier
    lds.access(1, np.array([3]), write=False)
    with pytest.raises(LdsRace, match=r"wave 2 writes LDS element \(0, 3\) that another wave read"):
        lds.access(2, np.array([3]), write=True)


def _run_func(text: str, arrays: list[np.ndarray], wave: int = 64) -> None:
    with new_context():
        module = ir.Module.parse(text)
        (fn,) = collect_ops(module.operation, "func.func")
        block = _AmdBlock(wave, wave, (0, 0, 0), {}, {})
        body = fn.regions[0].blocks[0]
        for arg, arr in zip(body.arguments, arrays):
            block.env[arg] = arr
        for _ in block.run(body, _Group(None)):
            pass


@pytest.mark.parametrize("subword", [0, 1])
def test_rdna3_f16_result_lands_in_the_half_opsel_selects_and_keeps_the_other(subword):
    A, B, C = (np.arange(256, dtype=np.float64).reshape(16, 16) % 5 - 2 for _ in range(3))
    ab = (
        _table(MAPS / "rdna3" / "v_wmma_f32_16x16x16_f16.A.csv"),
        _table(MAPS / "rdna3" / "v_wmma_f32_16x16x16_f16.B.csv"),
    )
    dmap = _table(MAPS / "rdna3" / f"v_wmma_f16_16x16x16_f16.D.opsel{4 * subword}.csv")
    a, b = np.zeros((32, 16), np.float16), np.zeros((32, 16), np.float16)
    for (lane, col), (i, j) in ab[0].items():
        a[lane, col] = A[i, j]
    for (lane, col), (i, j) in ab[1].items():
        b[lane, col] = B[i, j]
    c = np.full((32, 16), 99, np.float16)  # the other halves: must stay
    for (lane, reg), (i, j) in dmap.items():
        c[lane, 2 * reg + subword] = C[i, j]
    d = np.full((32, 16), np.nan, np.float16)
    v = "vector<16xf16>"
    _run_func(
        f"""func.func @k(%a: {v}, %b: {v}, %c: {v}, %d: memref<32x16xf16>) {{
              %c0 = arith.constant 0 : index
              %lane = gpu.thread_id x
              %r = amdgpu.wmma 16x16x16 %a * %b + %c subwordOffset({subword}) : {v}, {v}, {v}
              vector.store %r, %d[%lane, %c0] : memref<32x16xf16>, {v}
              return
            }}""",
        [a, b, c, d],
        32,
    )  # fmt: skip
    want = A @ B + C
    for (lane, reg), (i, j) in dmap.items():
        assert d[lane, 2 * reg + subword] == want[i, j] and d[lane, 2 * reg + 1 - subword] == 99


def test_raw_buffer_load_returns_zero_past_num_records():
    src = np.arange(1, 11, dtype=np.float16)  # 10 elements: 20 bytes of num_records
    dst = np.full((64, 4), np.nan, np.float16)
    _run_func(
        """func.func @k(%src: memref<10xf16>, %dst: memref<64x4xf16>) {
             %c0 = arith.constant 0 : index
             %c0_i32 = arith.constant 0 : i32
             %lane = gpu.thread_id x
             %i = arith.index_cast %lane : index to i32
             %v = amdgpu.raw_buffer_load boundsCheck(true) %src[%i] : memref<10xf16>, i32 -> vector<4xf16>
             vector.store %v, %dst[%lane, %c0] : memref<64x4xf16>, vector<4xf16>
             return
           }""",
        [src, dst],
    )  # fmt: skip
    assert dst[0].tolist() == [1, 2, 3, 4] and dst[8].tolist() == [9, 10, 0, 0] and not dst[10:].any()
