"""measure.children.run_child, the one-shot child of the benchmark scripts (fp8_plan, hopper_gemm,
hopper_product): its last JSON row, or how it ended (a crash's status, a hang stopped at the time limit)."""

import sys

from convbw_mlir.measure.children import run_child


def _child(code: str, limit: float = 30.0):
    return run_child([sys.executable, "-c", code], limit)


def test_a_child_that_prints_rows_gives_its_last_one():
    got = _child('print(\'{"name": "a"}\'); print(\'noise\'); print(\'{"name": "b", "us": 1.5}\')')
    assert got.row == {"name": "b", "us": 1.5} and got.returncode == 0 and got.ended == 0


def test_a_child_that_dies_gives_no_row_its_status_and_stderr():
    got = _child("import os, sys; print('warming up'); sys.stderr.write('CUDA_ERROR_ILLEGAL_ADDRESS\\n'); os._exit(7)")
    assert got.row is None and got.ended == 7 and "CUDA_ERROR_ILLEGAL_ADDRESS" in got.stderr


def test_a_child_that_hangs_is_stopped_at_the_limit_and_says_so():
    got = _child('import time; print(\'{"name": "early"}\', flush=True); time.sleep(60)', limit=1.0)
    assert got.row is None and got.returncode is None and got.ended == "timed out after 1 s"
