"""The on-disk kernel cache: compiled kernels and their metadata, keyed by problem + target + variant +
IREE version + product version (:func:`convbw_mlir.dispatch.variants.variant_key`).

Where: ``$CONVBW_CACHE_DIR``, else the platform's user cache folder (``platformdirs``:
``~/.cache/convbw-mlir`` on Linux), else the ``root`` given. Layout::

    <root>/entries/<key[:2]>/<key>/meta.json   problem, target, variant, flags, sizes and sha256 of each file
                                  kernel.vmfb  the module (native code: see Trust)
                                  <stage>.mlir the IR after each stage
    <root>/locks/<key>.lock                    one builder per key (filelock), others wait and read its entry
    <root>/tmp/                                entries being written, renamed into place when whole

Promises: an entry appears whole or not at all (written in ``tmp/`` and renamed); processes building the
same key at once compile it once (the others wait on its lock and then hit); an entry whose files do not
match the sizes and hashes its ``meta.json`` records (truncated, corrupt, half-deleted) is a miss, moved
away and rebuilt; past ``max_bytes`` the least recently used entries are evicted (a hit touches
``meta.json``); a full disk during a write is one :class:`CacheError` and leaves nothing behind.

Trust: a ``.vmfb`` holds native code the runtime executes. The cache folder is created private to the
user (0700); a cache folder or entry not owned by the user, or writable by others, is refused
(:class:`CacheTrustError`), never loaded.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convbw_mlir.compiler import CompiledOp
from convbw_mlir.plan import Plan
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["CacheError", "CacheInfo", "CacheTrustError", "KernelCache", "default_cache_dir"]

ENV_DIR = "CONVBW_CACHE_DIR"
ENV_MAX = "CONVBW_CACHE_MAX_BYTES"
# A kernel is 0.1-2 MB; 4 GiB keeps thousands of variants (every suite x target tuned) before evicting.
DEFAULT_MAX_BYTES = 4 << 30
# A builder holding a key's lock longer than this is presumed dead (IREE compiles take seconds).
LOCK_TIMEOUT_S = 1800
FORMAT = 1


class CacheError(RuntimeError):
    """The cache could not store or read an entry (the message says which and why)."""


class CacheTrustError(CacheError):
    """A cache folder or entry that is not the user's, or that others may write: refused, never loaded."""


@dataclass(frozen=True)
class CacheInfo:
    """What ``convbw cache info`` prints."""

    root: Path
    entries: int
    bytes: int
    max_bytes: int


def default_cache_dir() -> Path:
    """``$CONVBW_CACHE_DIR``, else the platform's user cache folder for convbw-mlir."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("convbw-mlir", appauthor=False))


def _max_bytes_from_env() -> int:
    raw = os.environ.get(ENV_MAX)
    if raw is None:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(f"{ENV_MAX}: expected a positive number of bytes, got {raw!r}")
    return value


def _check_private(path: Path, what: str) -> None:
    """Refuse ``path`` unless it is ours and nobody else may write it."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise CacheTrustError(f"cache: {what} {path} is a symbolic link: refused (kernels are native code)")
    if st.st_uid != os.getuid():
        raise CacheTrustError(f"cache: {what} {path} belongs to uid {st.st_uid}, not you: refused "
                              "(kernels are native code)")  # fmt: skip
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheTrustError(f"cache: {what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                              "refused (kernels are native code)")  # fmt: skip


def _sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


class KernelCache:
    """Compiled kernels on disk (see the module docstring).

    Args:
        root: the cache folder (default :func:`default_cache_dir`).
        max_bytes: the size limit (default ``$CONVBW_CACHE_MAX_BYTES`` or 4 GiB); least recently used
            entries are evicted past it.

    Raises:
        CacheTrustError: ``root`` exists and is not private to the user.
        ValueError: a ``max_bytes`` below 1.
    """

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.max_bytes = _max_bytes_from_env() if max_bytes is None else max_bytes
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"max_bytes: expected a positive number of bytes, got {self.max_bytes!r}")
        self._ready = False

    def __repr__(self) -> str:
        return f"KernelCache({str(self.root)!r}, max_bytes={self.max_bytes})"

    # -- folders -------------------------------------------------------------------------------------
    def _setup(self) -> None:
        if self._ready:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise CacheError(f"cache: cannot create {self.root}: {e.strerror}") from None
        _check_private(self.root, "folder")
        for sub in ("entries", "locks", "tmp"):
            (self.root / sub).mkdir(exist_ok=True, mode=0o700)
        self._ready = True

    def _entry(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"key: expected 64 hex digits (a sha256), got {key!r}")
        return self.root / "entries" / key[:2] / key

    def _lock(self, key: str) -> Any:
        from filelock import FileLock  # imported on a miss only: a hit stays fast

        return FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=LOCK_TIMEOUT_S)

    # -- read ----------------------------------------------------------------------------------------
    def get(self, key: str) -> CompiledOp | None:
        """The cached op of ``key``, or None (absent; or corrupt: then moved away, to be rebuilt).

        Raises:
            CacheTrustError: the entry is not the user's or others may write it.
        """
        self._setup()
        entry = self._entry(key)
        meta_path = entry / "meta.json"
        if not meta_path.exists():
            return None
        _check_private(entry, "entry")
        _check_private(meta_path, "entry file")
        try:
            meta = json.loads(meta_path.read_bytes())
            files = {}
            for name, (size, digest) in meta["files"].items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"file name {name!r} outside the entry")
                raw = (entry / name).read_bytes()
                if len(raw) != size or _sha256(raw) != digest:
                    raise ValueError(f"{name}: {len(raw)} bytes, expected {size} (or its sha256 differs)")
                files[name] = raw
            op = CompiledOp(
                problem=ConvBwdWeightProblem.from_dict(meta["problem"]),
                target=meta["target"],
                stages={s: files[f"{s}.mlir"].decode() for s in meta["stages"]},
                vmfb=files["kernel.vmfb"],
                pipeline=meta["pipeline"],
                flags=list(meta["flags"]),
                iree_version=meta["iree_version"],
                plan=Plan.from_dict(meta["plan"]) if meta.get("plan") else None,
                launch=_launch(files) if meta.get("launch") else None,  # CUDA's direct launch (cuda_launch.py)
            )
        except FileNotFoundError:
            if not entry.exists():  # evicted or replaced while we read: a plain miss
                return None
            self._discard(key, "a file is missing")
            return None
        except (ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as e:
            self._discard(key, str(e))
            return None
        try:
            os.utime(meta_path)  # least recently used eviction reads this
        except OSError:
            pass
        return op

    def _discard(self, key: str, why: str) -> None:
        warnings.warn(f"cache: entry {key[:16]} in {self.root} is corrupt ({why}): rebuilding it", stacklevel=3)
        with self._lock(key):
            self._remove(self._entry(key))

    def _remove(self, entry: Path) -> None:
        """Move ``entry`` out of sight at once (a rename), then delete it."""
        if not entry.exists():
            return
        trash = Path(tempfile.mkdtemp(prefix="trash-", dir=self.root / "tmp"))
        try:
            entry.rename(trash / entry.name)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)

    # -- write ---------------------------------------------------------------------------------------
    def put(self, key: str, op: CompiledOp, variant: dict[str, Any] | None = None) -> Path:
        """Store ``op`` under ``key`` (replacing what is there); returns the entry's folder.

        Raises:
            CacheError: the disk is full or the folder not writable (nothing is left behind).
        """
        self._setup()
        files = {"kernel.vmfb": bytes(op.vmfb)} | {f"{s}.mlir": t.encode() for s, t in op.stages.items()}
        files |= op.launch.files() if op.launch is not None else {}  # launch.json + PTX: CUDA's direct launch
        meta = {
            "format": FORMAT,
            "key": key,
            "problem": op.problem.to_dict(),
            "target": op.target,
            "variant": variant,
            "plan": op.plan.to_dict() if op.plan else None,
            "pipeline": op.pipeline,
            "flags": op.flags,
            "iree_version": op.iree_version,
            "stages": list(op.stages),
            "created": time.time(),
            "files": {n: [len(raw), _sha256(raw)] for n, raw in files.items()},
            "launch": op.launch is not None,
        }
        files["meta.json"] = (json.dumps(meta, indent=1) + "\n").encode()
        entry = self._entry(key)
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"{key[:16]}-", dir=self.root / "tmp"))
            for name, raw in files.items():  # meta.json last: an entry is valid only with it
                with open(tmp / name, "wb") as f:
                    f.write(raw)
                    f.flush()
                    os.fsync(f.fileno())
            entry.parent.mkdir(exist_ok=True, mode=0o700)
            self._remove(entry)
            tmp.rename(entry)
            tmp = None
        except OSError as e:
            why = "no space left on the device" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
            raise CacheError(f"cache: could not store {op.problem.name} for {op.target} in {self.root}: {why} "
                             "(nothing was stored)") from None  # fmt: skip
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=key)
        return entry

    def get_or_build(self, key: str, build: Callable[[], CompiledOp],
                     variant: dict[str, Any] | None = None) -> tuple[CompiledOp, bool]:  # fmt: skip
        """``(op, hit)``: the cached op, or ``build()``'s result stored under ``key``. Processes building
        one key at once compile it once: the others wait on its lock and read the entry.

        A full disk while storing is a warning: the op is returned, uncached.
        """
        op = self.get(key)
        if op is not None:
            return op, True
        with self._lock(key):
            op = self.get(key)  # built by another process while we waited
            if op is not None:
                return op, True
            op = build()
            try:
                self.put(key, op, variant)
            except CacheError as e:
                warnings.warn(str(e), stacklevel=2)
        return op, False

    # -- maintenance ---------------------------------------------------------------------------------
    def _entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of each entry."""
        out = []
        for meta in (self.root / "entries").glob("*/*/meta.json"):
            try:
                st = meta.stat()
                size = sum(f.stat().st_size for f in meta.parent.iterdir())
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, size, meta.parent))
        return out

    def evict(self, keep: str | None = None) -> int:
        """Remove least recently used entries until the cache is within ``max_bytes``; returns how many."""
        self._setup()
        from filelock import FileLock

        with FileLock(str(self.root / "locks" / "evict.lock"), timeout=LOCK_TIMEOUT_S):
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, entry in entries:
                if total <= self.max_bytes:
                    break
                if entry.name == keep:
                    continue
                self._remove(entry)
                total -= size
                removed += 1
        return removed

    def info(self) -> CacheInfo:
        self._setup()
        entries = self._entries()
        return CacheInfo(self.root, len(entries), sum(size for _, size, _ in entries), self.max_bytes)

    def clear(self) -> int:
        """Remove every entry (only what the cache wrote); returns how many."""
        self._setup()
        entries = self._entries()
        for _, _, entry in entries:
            self._remove(entry)
        for stale in (self.root / "tmp").iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        return len(entries)


def _launch(files: dict[str, bytes]) -> Any:
    """The direct CUDA launch's schedule among an entry's (checked) files."""
    from convbw_mlir.cuda_launch import Launch

    return Launch.from_files(files.__getitem__)
