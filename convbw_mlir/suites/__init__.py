"""Problem suites (package data ``convbw_mlir/suites/*.tsv``): ``name<TAB>ckProfiler problem arguments``."""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["SUITES_DIR", "load_suite", "suite_models", "suite_names"]

# Package data, so a wheel install finds the suites as well as a checkout does.
SUITES_DIR: Traversable = files("convbw_mlir") / "suites"


def suite_names() -> list[str]:
    """Names of the suites shipped with the package (``load_suite`` accepts each)."""
    return sorted(f.name.removesuffix(".tsv") for f in SUITES_DIR.iterdir() if f.name.endswith(".tsv"))


def _suite_file(path: str | Path) -> Path | Traversable:
    p: Path | Traversable = Path(path)
    if not p.is_file():
        p = SUITES_DIR / f"{path}.tsv"
    if not p.is_file():
        raise FileNotFoundError(f"suite: {path} is neither a file nor a suite name ({', '.join(suite_names())})")
    return p


# A comment naming one model's layers that use the next problem: ``# resnet18: layer1.0.conv1, ...`` (the zoo's);
# header comments have spaces before their colon or none.
_MODEL_COMMENT = re.compile(r"^#\s*([^\s:]+):\s")


def suite_models(path: str | Path) -> dict[str, list[str]]:
    """Problem name -> the models it comes from, read from the comment lines before each problem (the zoo's
    ``# model: layers``); a problem without such comments maps to ``[]``.

    Raises:
        FileNotFoundError: no such suite.
    """
    out: dict[str, list[str]] = {}
    models: list[str] = []
    for line in _suite_file(path).read_text().splitlines():
        if line.startswith("#"):
            if m := _MODEL_COMMENT.match(line):
                models.append(m.group(1))
        elif line.strip():
            out[line.partition("\t")[0]] = sorted(set(models))
            models = []
    return out


def load_suite(path: str | Path, dtype: str = "f16") -> list[tuple[str, ConvBwdWeightProblem]]:
    """(name, problem) per line; ``path`` is a .tsv file or the name of a shipped suite.

    Raises:
        FileNotFoundError: no such suite. ValueError: a malformed line (with its line number).
    """
    p = _suite_file(path)
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
