"""Package list for setuptools: discovery of ``convbw_mlir`` plus the top-level ``dialects/`` and ``passes/``.

The metadata lives in pyproject.toml. pyproject's ``packages.find`` cannot rename what it finds, and
``dialects/`` and ``passes/`` install as ``convbw_mlir.dialects`` and ``convbw_mlir.passes``
(``[tool.setuptools.package-dir]``), so their subpackages are discovered here instead of listed by hand.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
# Installed name -> folder; the same mapping as pyproject.toml's [tool.setuptools.package-dir].
MAPPED = {"convbw_mlir.dialects": "dialects", "convbw_mlir.passes": "passes"}
# Namespace discovery so data folders (convbw_mlir/suites) are packages too, as setuptools expects of package data.
SKIP = ["__pycache__", "*.__pycache__"]


def discover_packages(root: Path = ROOT) -> list[str]:
    """Every package (any folder, data folders included) of ``convbw_mlir/`` and of the mapped folders."""
    packages = find_namespace_packages(str(root), include=["convbw_mlir", "convbw_mlir.*"], exclude=SKIP)
    for name, folder in MAPPED.items():
        if not (root / folder / "__init__.py").is_file():
            raise ValueError(f"package-dir: {folder}/ has no __init__.py, so {name} would not install")
        packages += [name] + [f"{name}.{sub}" for sub in find_namespace_packages(str(root / folder), exclude=SKIP)]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=discover_packages())
