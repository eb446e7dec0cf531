"""The README's Python snippet: its problem and the lines offered instead ("or:") are one problem."""

from __future__ import annotations

import re
from pathlib import Path

from convbw_mlir import ConvBwdWeightProblem

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readmes_or_lines_pose_the_snippets_problem():
    text = README.read_text()
    block = text.split("## The Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    snippet = re.search(r"^p = (ConvBwdWeightProblem\(.*?^\))", block, re.S | re.M).group(1)
    problem = eval(snippet, {"ConvBwdWeightProblem": ConvBwdWeightProblem})
    alternatives = re.findall(r"^# or: (ConvBwdWeightProblem\.from_\w+\(.*\))$", block, re.M)
    assert len(alternatives) == 2  # from_ck and from_miopen
    for line in alternatives:
        assert eval(line, {"ConvBwdWeightProblem": ConvBwdWeightProblem}) == problem, line


def _resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_name_the_readme_gives_imports_from_where_it_says():
    text = README.read_text()
    imports = re.findall(r"^\s*from (convbw_mlir[\w.]*) import ([\w, ]+)", text, re.M)
    dotted = set(re.findall(r"`(convbw_mlir(?:\.\w+)+)", text)) | set(re.findall(r"-m (convbw_mlir[\w.]*)", text))
    paths = set(re.findall(r"\b((?:convbw_mlir|bench|passes|dialects|tests|docs)/[\w/.-]+\.(?:py|md|tsv))", text))
    assert len(imports) >= 5 and len(dotted) >= 10 and len(paths) >= 10  # the README was read
    for module, names in imports:
        for name in (n.strip() for n in names.split(",") if n.strip()):
            if name == "conv2d_weight" or module == "convbw_mlir.torch":
                continue  # needs torch (the [torch] extra): tests/test_torch.py imports it
            _resolve(f"{module}.{name}")
    for name in sorted(dotted):
        if not name.startswith("convbw_mlir.torch"):
            _resolve(name.rstrip("."))
    root = README.parent
    missing = [p for p in sorted(paths) if not (root / p).exists()]
    assert missing == []
