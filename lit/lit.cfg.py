# lit configuration for convbw-mlir: FileCheck tests of passes, convbw-opt, convbw and the Python API.
import os
import shutil
import sys

import lit.formats

config.name = "convbw-mlir"  # noqa: F821 - lit injects `config`
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py", ".test"]
config.excludes = ["lit.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "Output")

python = sys.executable  # the interpreter running lit: the project's .venv
bindir = os.path.dirname(python)
config.environment["PATH"] = os.pathsep.join([bindir, config.environment.get("PATH", os.environ.get("PATH", ""))])
for var in ("HOME", "TMPDIR", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
# compile_op's kernel cache: a fresh folder each run (a kept one could pass tests on kernels of older code),
# never the user's ~/.cache
kernel_cache = os.path.join(config.test_exec_root, "kernel-cache")
shutil.rmtree(kernel_cache, ignore_errors=True)
config.environment["CONVBW_CACHE_DIR"] = kernel_cache

filecheck = shutil.which("filecheck", path=bindir) or shutil.which("filecheck")
if not filecheck:
    lit_config.fatal("filecheck (PyPI package 'filecheck') is not installed; run `make test`")  # noqa: F821
config.substitutions.append(("%PYTHON", python))
config.substitutions.append(("%convbw-opt", f"{python} -m convbw_mlir.opt"))
config.substitutions.append(("%convbw", f"{python} -m convbw_mlir"))
# PyPI's FileCheck clone; --enable-var-scope as LLVM's lit suites use it. It dumps the input on failure.
config.substitutions.append(("FileCheck", f"{filecheck} --enable-var-scope"))
