"""Problem suites (bench/suites/*.tsv): ``name<TAB>ckProfiler problem arguments``."""

from __future__ import annotations

from pathlib import Path

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["SUITES_DIR", "load_suite"]

SUITES_DIR = Path(__file__).resolve().parents[2] / "bench" / "suites"


def load_suite(path: str | Path, dtype: str = "f16") -> list[tuple[str, ConvBwdWeightProblem]]:
    """(name, problem) per line; ``path`` is a file or a suite name in bench/suites.

    Raises:
        FileNotFoundError: no such suite. ValueError: a malformed line (with its line number).
    """
    p = Path(path)
    if not p.is_file():
        p = SUITES_DIR / f"{path}.tsv"
    if not p.is_file():
        known = ", ".join(sorted(f.stem for f in SUITES_DIR.glob("*.tsv")))
        raise FileNotFoundError(f"suite: {path} is neither a file nor a suite name ({known})")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, args = line.partition("\t")
        if not sep:
            raise ValueError(f"suite: {p}:{i}: expected 'name<TAB>ckProfiler arguments'")
        try:
            out.append((name, ConvBwdWeightProblem.from_ck(args, dtype=dtype)))
        except ValueError as e:
            raise ValueError(f"suite: {p}:{i} ({name}): {e}") from None
    return out
