"""Run a compile in a child process, so that an IREE crash does not end the caller.

IREE 3.13 kills the compiling process on some inputs (a segfault on unregistered ops, LLVM aborts such
as "Cannot select"). :func:`call` runs a function in ``python -m convbw_mlir.build.isolate``: the function and
its arguments go in pickled on stdin, the result (or the exception it raised) comes back pickled in a
file; a child killed by a signal, or past its time limit, becomes :class:`CompilerCrash` (SIGINT, a Ctrl-C
the child got before its caller did, becomes KeyboardInterrupt).

    vmfb = call(compile_module, text, "host", what="conv.mlir for host")

``compile_op(..., isolate=True)``, the CLI, the dispatcher's builds and the benchmark artifacts all use it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from convbw_mlir.build.iree import CompileError

__all__ = ["CompilerCrash", "call"]


class CompilerCrash(CompileError):
    """The child process died (a signal or a non-zero exit) or ran past its time limit.

    Attributes:
        returncode: the child's exit status (negative: the signal), None after a timeout.
        stderr: what the child wrote to stderr.
    """

    def __init__(self, message: str, returncode: int | None, stderr: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.returncode, self.stderr))


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def _last_line(text: str) -> str:
    # The last thing a dying compiler says ("LLVM ERROR: Cannot select ...") is the useful part.
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith((" ", "\t", "#"))]
    return lines[-1][:300] if lines else ""


def call(fn: Callable[..., Any], *args: Any, what: str, timeout: float | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a child process; its result, or the exception it raised, re-raised here.

    Args:
        fn: a module-level function (or a class's method): the child imports it by name.
        *args, **kwargs: its arguments (picklable).
        what: what is being compiled, for the error message (e.g. ``"<problem> for gfx942"``).
        timeout: seconds before the child is killed; None waits for ever.

    Raises:
        CompilerCrash: the child died ("IREE crashed (SIGSEGV) compiling <what>") or timed out.
        ValueError: ``timeout`` is not positive.
        Exception: whatever ``fn`` raised in the child (CompileError, ValueError, ...).
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout: must be > 0 seconds, got {timeout!r}")
    module = fn.__module__
    if module == "__main__":  # run as `python -m pkg.mod`: the child finds it under its real name
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        script = getattr(main, "__file__", None)
        if spec is None and script is None:
            raise ValueError(f"fn: {fn.__qualname__} is defined in an interactive session; a child cannot import it")
        module = spec.name if spec is not None else f"{SCRIPT_PREFIX}{Path(script).resolve()}"
    payload = pickle.dumps(((module, fn.__qualname__), args, kwargs))
    # A private folder, removed whole at the end: a child outliving its caller cannot leave a result file there.
    folder: Path | None = None
    proc: subprocess.Popen | None = None
    try:
        try:
            with _signals_held():  # a Ctrl-C or SIGTERM now comes once folder and proc are known (below)
                folder = Path(tempfile.mkdtemp(prefix="convbw-isolate-"))
                cmd = [sys.executable, "-m", "convbw_mlir.build.isolate", str(folder / "result.pickle")]
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            _, raw_err = proc.communicate(payload, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, raw_err = proc.communicate()
            err = (raw_err or b"").decode(errors="replace")
            raise CompilerCrash(f"IREE timed out after {timeout:g} s compiling {what}", None, err) from None
        except BaseException:  # Ctrl-C, SIGTERM (the CLIs raise it), anything: the child goes with us
            if proc is not None:
                proc.kill()
                proc.wait()
            raise
        if proc.returncode == -signal.SIGINT:  # a terminal's Ctrl-C reaches the whole group: the child went first
            raise KeyboardInterrupt
        result = folder / "result.pickle"
        err = raw_err.decode(errors="replace")
        if proc.returncode != 0 or not result.is_file() or result.stat().st_size == 0:
            tail = _last_line(err)
            message = f"IREE crashed ({_how(proc.returncode)}) compiling {what}" + (f": {tail}" if tail else "")
            raise CompilerCrash(message, proc.returncode, err)
        status, value = pickle.loads(result.read_bytes())
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    if status == "error":
        raise value
    return value


_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the child starts, then deliver them: raised inside ``Popen`` they would end
    the caller with the child started and its handle lost (an orphan compile writing into a removed folder).
    Python runs signal handlers in the main thread only; elsewhere nothing is held (the child watches its parent)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append((signum, frame))) for s in _HELD}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for signum, frame in caught[:1]:  # as if it came now
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _exit_with_parent(interval_s: float = 1.0) -> None:
    """End this child when its parent is gone (killed, or ended without waiting): no orphan compile goes on."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="convbw-isolate-parent-watch").start()


# A function of a script run as ``python path/script.py`` (the benchmarks in bench/): the child loads the
# script by its path, under another name than __main__, so its main() does not run again.
SCRIPT_PREFIX = "script:"


def _import(module: str) -> Any:
    if not module.startswith(SCRIPT_PREFIX):
        return importlib.import_module(module)
    path = module.removeprefix(SCRIPT_PREFIX)
    sys.path.insert(0, str(Path(path).parent))  # as for the script itself: its folder's modules import
    spec = importlib.util.spec_from_file_location("_convbw_isolated_script", path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def _child(result_path: str) -> None:
    _exit_with_parent()
    (module, qualname), args, kwargs = pickle.loads(sys.stdin.buffer.read())
    try:
        fn = functools.reduce(getattr, qualname.split("."), _import(module))
        out = ("ok", fn(*args, **kwargs))
    except Exception as e:  # the parent re-raises it
        out = ("error", e)
    try:
        data = pickle.dumps(out)
    except Exception as e:  # what does not pickle: its type and message still travel
        what = f"{type(out[1]).__name__}: {out[1]}" if out[0] == "error" else f"the result did not pickle: {e}"
        data = pickle.dumps(("error", CompileError(what)))
    Path(result_path).write_bytes(data)


if __name__ == "__main__":
    _child(sys.argv[1])
