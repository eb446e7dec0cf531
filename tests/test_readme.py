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
