"""The `convbw` command: run and compile, and one-line errors with exit code 1."""

import subprocess
import sys

import pytest

from convbw_mlir.cli import main

MIOPEN = "convfp16 -F 4 -n 4 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -m conv -g 1"


def test_run_from_a_miopen_line_verifies_and_reports_time_and_error():
    # The foundation issue's acceptance command, as a user types it (a real process, console script).
    res = subprocess.run([sys.executable, "-m", "convbw_mlir", "run", "--miopen", MIOPEN, "--reps", "2"],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "problem: 2 1 4 64 64 3 3 56 56 1 1 1 1 1 1 1 1" in out
    assert "TFLOP/s" in out and " us (median of " in out
    assert "verify:  max error" in out and out.rstrip().endswith("PASS")


def test_run_with_named_flags_and_types(capsys):
    flags = "-g 2 -n 2 -c 3 -k 5 --input 7x9 --filter 3 --stride 2x1 --pad-low 1x0 --pad-high 0x2 --type bf16"
    rc = main(["run", *flags.split(), "--dw-type", "f32", "--reps", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "types: bf16 -> f32" in out and "PASS" in out


def test_compile_emits_linalg_and_vmfb(tmp_path, capsys):
    assert main(["compile", "--ck", "1 2 2 4 4 3 16 1 1 1 1", "--emit", "linalg"]) == 0
    text = capsys.readouterr().out
    assert "linalg.generic" in text and "tensor.extract" in text  # the padded x, read by the gather pad
    out = tmp_path / "k.vmfb"
    assert (
        main(["compile", "--ck", "1 2 2 4 4 3 16 1 1 1 1", "--target", "sm_80", "--emit", "vmfb", "-o", str(out)]) == 0
    )
    assert out.read_bytes()[:2] == b"PK" and b"cuda-nvptx-fb" in out.read_bytes()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--miopen", MIOPEN.replace("-F 4", "-F 2")], "convbw: error: -F: direction '2' is not supported"),
        (["run", "--ck", "2 1 4 8 8 3 3 2 2 1 1 1 1 0 0 0 0"], "convbw: error: filter_size: filter_size[0]=3"),
        (["run", "-n", "2", "-c", "3"], "convbw: error: problem: missing --out-channels, --input, --filter"),
        (
            ["run", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--target", "gfx908"],
            "convbw: error: convbw run: argument --target",
        ),
        (["run", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--target", "gfx942"], "convbw: error: device: the hip driver"),
        (["compile", "--input", "8xa"], "convbw: error: convbw compile: argument --input"),
        (["frobnicate"], "convbw: error: convbw: argument command: invalid choice"),
        (
            ["run", "--ck", "2 1 1 4 4 3 3 8 8 1 1 1 1 0 0 0 0", "--layout", "NGCHW"],
            "convbw: error: layout: 'NGCHW' is ambiguous",
        ),
        (["run", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--layout", "NCWH"], "convbw: error: layout: unknown layout 'NCWH'"),
        (
            ["run", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--reps", "-5"],
            "convbw: error: convbw run: argument --reps: must be >= 1, got -5",
        ),
        (
            ["run", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--reps", "0"],
            "convbw: error: convbw run: argument --reps: must be >= 1, got 0",
        ),
    ],
)
def test_errors_are_one_line_and_exit_code_1(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_compile_failure_leaves_no_output_file(tmp_path, capsys):
    out = tmp_path / "never.mlir"
    assert main(["compile", "--ck", "1 1 1 4 4 3 8 1 1 0 0", "--layout", "torch", "--type", "f64", "-o", str(out)]) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_output_to_a_device_or_fifo_writes_through_and_never_replaces_it(tmp_path):
    import os
    import stat
    import threading

    from convbw_mlir.files import write_atomic

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    write_atomic(str(fifo), "module {}\n")
    reader.join(timeout=10)
    assert got == [b"module {}\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still the fifo, not a regular file moved over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_iree_failure_is_one_error_line_and_the_command_exits_1():
    # IREE rejects the 2**63-byte tensors from its worker threads: this aborted Python (exit 134).
    argv = ["compile", "-n", "1", "-c", "1", "-k", "1", "--input", "4611686018427387904", "--filter", "1"]
    res = subprocess.run([sys.executable, "-m", "convbw_mlir", *argv], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.startswith("convbw: error: ") and res.stderr.count("\n") == 1
    assert "Fatal Python error" not in res.stderr and "Traceback" not in res.stderr


def test_output_errors_name_the_output_path_not_a_temporary_file_or_its_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "k.mlir"
    assert main(["compile", "--ck", "1 1 2 4 4 3 8 1 1 0 0", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == f"convbw: error: -o: cannot write {out}: {tmp_path / 'file'} is not a folder\n"
