"""The torch examples where torch is missing: one line saying how to install it, exit code 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# torch made unimportable in the child, whether or not it is installed here
NO_TORCH = "import runpy, sys; sys.modules['torch'] = None; runpy.run_path(sys.argv[1], run_name='__main__')"


@pytest.mark.parametrize("name", ["torch_quickstart.py", "torch_training.py", "torch_enable.py", "whole_module.py"])
def test_a_torch_example_without_torch_says_how_to_install_it(name):
    r = subprocess.run([sys.executable, "-c", NO_TORCH, str(EXAMPLES / name)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr == f"examples/{name} needs PyTorch: pip install .[torch]\n"
