"""Shipped problem suites: found by name from package data, files by path, malformed lines named."""

from __future__ import annotations

import pytest

from convbw_mlir.suites import load_suite, suite_models, suite_names


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


def test_suite_models_reads_the_models_naming_each_problem_not_the_header(tmp_path):
    path = tmp_path / "zoo.tsv"
    path.write_text("# convbw problems: 2 models traced\n# 2 distinct problems\n# netA: l1, l2\n# netB: x.y\n"
                    "a.n32\t2 1 1 4 4 3 3 8 8 1 1 1 1 1 1 1 1\n# netB: z\nb.n32\t2 1 1 4 4 1 1 8 8 1 1 1 1 0 0 0 0\n"
                    "plain\t2 1 1 4 4 1 1 8 8 1 1 1 1 0 0 0 0\n")  # fmt: skip
    assert suite_models(path) == {"a.n32": ["netA", "netB"], "b.n32": ["netB"], "plain": []}
    zoo = suite_models("zoo")
    assert list(zoo) == [name for name, _ in load_suite("zoo")] and all(zoo.values())
    assert len({m for ms in zoo.values() for m in ms}) == 44  # the zoo's header: 44 models


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
