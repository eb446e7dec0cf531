"""Shipped problem suites: found by name from package data, files by path, malformed lines named."""

from __future__ import annotations

import pytest

from convbw_mlir.suites import load_suite, suite_names


def test_shipped_suites_load_by_name():
    assert suite_names() == ["ck_test_grouped_convnd_bwd_weight", "classes", "models", "seeds", "zoo"]
    names = [name for name, _ in load_suite("ck_test_grouped_convnd_bwd_weight", "bf16")]
    assert len(names) == 23 and names[0] == "ck1d_a"
    assert {p.dtype for _, p in load_suite("seeds", "bf16")} == {"bf16"}


def test_a_suite_file_loads_by_path(tmp_path):
    path = tmp_path / "mine.tsv"
    path.write_text("# comment\n\ntiny\t2 1 1 4 4 3 3 8 8 1 1 1 1 1 1 1 1\n")
    ((name, problem),) = load_suite(path)
    assert name == "tiny" and problem.in_channels == 4 and problem.input_size == (8, 8)


def test_an_unknown_suite_names_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match=r"suite: nope is neither a file nor a suite name \(ck_test.*, zoo\)"):
        load_suite("nope")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("no_tab 2 1 1 4 4", r"mine.tsv:2: expected 'name<TAB>ckProfiler arguments'"),
        ("bad\t2 1 1", r"mine.tsv:2 \(bad\)"),
    ],
)
def test_a_malformed_line_is_named_with_its_line_number(tmp_path, line, message):
    path = tmp_path / "mine.tsv"
    path.write_text(f"# header\n{line}\n")
    with pytest.raises(ValueError, match=message):
        load_suite(path)
