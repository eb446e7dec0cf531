"""The on-disk kernel cache: compiled kernels and their metadata, keyed by problem + target + variant +
IREE version + product version + the hash of the code that shapes a kernel
(:func:`convbw_mlir.dispatch.variants.variant_key`).

Where: ``$CONVBW_CACHE_DIR``, else the platform's user cache folder (``platformdirs``:
``~/.cache/convbw-mlir`` on Linux), else the ``root`` given. Layout::

    <root>/CACHEDIR.TAG                        marks the folder as this cache (bford.info/cachedir)
    <root>/entries/<key[:2]>/<key>/meta.json   the request keyed, problem, target, variant, flags, sizes and
                                               sha256 of each file
                                  kernel.vmfb  the module (native code: see Trust)
                                  <stage>.mlir the IR after each stage
    <root>/locks/<key>.lock                    one builder per key (filelock), others wait and read its entry
    <root>/tmp/                                entries being written, renamed into place when whole
    <root>/verdicts/<sha256>.json              the torch switch's remembered ours-vs-torch verdicts
                                               (:mod:`convbw_mlir.dispatch.verdicts`; ``clear`` removes them)

Promises: a hit is for its key: an entry whose stored key, request, problem or target differs from what
was asked, whose ``meta.json`` is malformed (a field missing or of the wrong type), or whose files do not
match the sizes and hashes it records (truncated, corrupt, half-deleted) is a miss, warned, moved away and
rebuilt. An entry appears whole or not at all (written in ``tmp/`` and renamed); processes building the
same key at once compile it once (the others wait on its lock and then hit); past ``max_bytes`` the least
recently used entries are evicted (a hit touches ``meta.json``); a full disk during a write is one
:class:`CacheError` and leaves nothing behind, and a cache that cannot be written is a warning (the kernel
is compiled, uncached).

A folder that is not ours is never written or removed: the cache writes ``CACHEDIR.TAG`` when it creates
its root (or takes an empty folder); an existing folder without it that holds anything else is refused
(:func:`convbw_mlir.files.claim_folder`), and ``clear`` removes only entries and temporaries the cache
named itself. ``info`` and ``clear`` create nothing.

Trust: a ``.vmfb`` holds native code the runtime executes. The cache folder is created private to the
user (0700); a cache folder or entry not owned by the user, or writable by others, is refused
(:class:`CacheTrustError`), never loaded.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.files import claim_folder
from convbw_mlir.plan import Plan, plan_properties
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["CacheError", "CacheInfo", "CacheTrustError", "KernelCache", "default_cache_dir"]

ENV_DIR = "CONVBW_CACHE_DIR"
ENV_MAX = "CONVBW_CACHE_MAX_BYTES"
# A kernel is 0.1-2 MB; 4 GiB keeps thousands of variants (every suite x target tuned) before evicting.
DEFAULT_MAX_BYTES = 4 << 30
# A builder holding a key's lock longer than this is presumed dead (IREE compiles take seconds).
LOCK_TIMEOUT_S = 1800
FORMAT = 2  # 2: the request keyed is stored and checked on a hit
# The Cache Directory Tagging signature (bford.info/cachedir: backup tools skip the folder); the second line
# tells this cache's root from other tools' caches.
TAG = "CACHEDIR.TAG"
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by convbw-mlir's kernel cache.\n")  # fmt: skip
SUBFOLDERS = ("entries", "locks", "tmp")
# Names of a root made before the tag existed (and the tuning databases kept beside the entries).
UNTAGGED = {*SUBFOLDERS, "tuning"}
KEY_RE = re.compile(r"[0-9a-f]{64}")
# The temporaries put and _remove make in tmp/ (tempfile.mkdtemp: prefix + 8 random characters).
TEMP_RE = re.compile(r"([0-9a-f]{16}|trash)-\w{8}")
# The torch switch's remembered verdicts (convbw_mlir/dispatch/verdicts.py): their folder and the names clear removes.
VERDICTS = "verdicts"
VERDICT_RE = re.compile(r"[0-9a-f]{64}\.json")
# The types each field of meta.json must have (anything else: a malformed entry, rebuilt).
META_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": int, "key": str, "problem": dict, "target": str, "variant": (dict, type(None)),
    "plan": (dict, type(None)), "pipeline": str, "flags": list, "iree_version": str, "stages": list,
    "files": dict, "launch": bool,
}  # fmt: skip


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


def _is_tagged(root: Path) -> bool:
    try:
        return (root / TAG).read_text(errors="replace").startswith(TAG_TEXT)
    except OSError:
        return False


def _being_tagged(root: Path) -> bool:
    """Our tag, or the start of it while another process that makes the same root writes it (two first builds at
    once: the other's subfolders and tag appear between this one's checks)."""
    try:
        text = (root / TAG).read_text(errors="replace")
    except OSError:
        return False
    return TAG_TEXT.startswith(text) or text.startswith(TAG_TEXT)


def _check_meta(meta: Any, key: str) -> None:
    """Raise ValueError naming the first field of ``meta`` that is missing, of the wrong type, or not for ``key``."""
    if not isinstance(meta, dict):
        raise ValueError(f"meta.json: expected an object, got {type(meta).__name__}")
    for name, kind in META_TYPES.items():
        value = meta.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"meta.json: {name}: expected {getattr(kind, '__name__', 'an object or null')}, "
                             f"got {type(value).__name__}")  # fmt: skip
    if meta["format"] != FORMAT:
        raise ValueError(f"meta.json: format {meta['format']}, expected {FORMAT}")
    if meta["key"] != key:
        raise ValueError(f"stored under key {meta['key'][:16]}, not {key[:16]}")
    for name in ("flags", "stages"):
        if not all(isinstance(v, str) for v in meta[name]):
            raise ValueError(f"meta.json: {name}: expected a list of strings")
    for name, record in meta["files"].items():
        if not (isinstance(record, list) and len(record) == 2 and isinstance(record[0], int)
                and isinstance(record[1], str)):  # fmt: skip
            raise ValueError(f"meta.json: files: {name}: expected [size, sha256], got {record!r:.60}")
        if "/" in name or name.startswith("."):
            raise ValueError(f"file name {name!r} outside the entry")
    request = meta.get("request")
    if request is not None:  # the request this key hashes: what was asked, and what the entry must be for
        from convbw_mlir.dispatch.variants import request_key

        if not isinstance(request, dict) or request_key(request) != key:
            raise ValueError("its stored request does not hash to its key")
        if request.get("problem") != meta["problem"] or request.get("target") != meta["target"]:
            raise ValueError("its problem or target is not the one its key asks for")


class _Corrupt(Exception):
    """An entry that is not a valid hit for its key (the message says why)."""


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
        self.verdicts_cleared = 0  # what the last clear() removed of the switch's verdicts

    def __repr__(self) -> str:
        return f"KernelCache({str(self.root)!r}, max_bytes={self.max_bytes})"

    def __getstate__(self) -> dict[str, Any]:
        # another process, maybe on another machine (a Ray build task), checks and makes the folder itself
        return {**self.__dict__, "_ready": False}

    # -- folders -------------------------------------------------------------------------------------
    def _claim(self, create: bool) -> bool:
        """Check the root is this cache (tagged; or empty, or an untagged cache of before the tag); with
        ``create``, make it and tag it. Returns whether the root exists.

        Raises:
            CacheTrustError: the root is a link, not the user's, or writable by others.
            ValueError: the root is a file, or an untagged folder holding anything else (named).
        """
        if not os.path.lexists(self.root):
            if not create:
                return False
            try:
                self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as e:
                raise CacheError(f"cache: cannot create {self.root}: {e.strerror}") from None
        _check_private(self.root, "folder")
        tagged = self.root.is_dir() and _is_tagged(self.root)
        if not tagged:

            def ours(name: str) -> bool:  # a root of an older version (no tag), or one another process makes now
                if name == TAG:
                    return _being_tagged(self.root)
                names = set(os.listdir(self.root)) - {TAG}
                return names <= UNTAGGED and (bool(names & {"entries", "tuning"}) or _being_tagged(self.root))

            claim_folder(self.root, "cache", ours, writer=f"the kernel cache did not write (the folder has no {TAG})")
        if create:
            try:
                for sub in SUBFOLDERS:
                    (self.root / sub).mkdir(exist_ok=True, mode=0o700)
                if not tagged:
                    (self.root / TAG).write_text(TAG_TEXT)
            except OSError as e:
                raise CacheError(f"cache: cannot write {self.root}: {e.strerror or e}") from None
        return True

    def _setup(self) -> None:
        if not self._ready:
            self._claim(create=True)
            self._ready = True

    def tuning_dir(self) -> Path:
        """``<root>/tuning``, where ``convbw tune --import`` puts databases (the root is made and tagged first)."""
        self._setup()
        return self.root / "tuning"

    def native_dir(self) -> Path:
        """``<root>/native``, where the torch switch's C++ hot path is built (the root is made and tagged first)."""
        self._setup()
        return self.root / "native"

    def _entry(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"key: expected 64 hex digits (a sha256), got {key!r}")
        return self.root / "entries" / key[:2] / key

    def _lock(self, key: str) -> Any:
        from filelock import FileLock  # imported on a miss only: a hit stays fast

        return FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=LOCK_TIMEOUT_S)

    # -- read ----------------------------------------------------------------------------------------
    def get(self, key: str) -> CompiledOp | None:
        """The cached op of ``key``, or None (absent; or corrupt or not for ``key``: then warned, moved away,
        to be rebuilt).

        Raises:
            CacheTrustError: the entry is not the user's or others may write it.
        """
        self._setup()
        try:
            return self._hit(key)
        except _Corrupt:
            pass
        with self._lock(key):
            try:
                return self._hit(key)  # again under the lock: another process may have rebuilt it
            except _Corrupt as e:
                self._discard(key, str(e))
                return None

    def _hit(self, key: str) -> CompiledOp | None:
        """The entry's op, None if absent; raises _Corrupt for an entry that is not a valid hit for ``key``."""
        entry = self._entry(key)
        meta_path = entry / "meta.json"
        if not meta_path.exists():
            return None
        _check_private(entry, "entry")
        _check_private(meta_path, "entry file")
        try:
            meta = json.loads(meta_path.read_bytes())
            _check_meta(meta, key)
            files = {}
            for name, (size, digest) in meta["files"].items():
                raw = (entry / name).read_bytes()
                if len(raw) != size or _sha256(raw) != digest:
                    raise ValueError(f"{name}: {len(raw)} bytes, expected {size} (or its sha256 differs)")
                files[name] = raw
            problem = ConvBwdWeightProblem.from_dict(meta["problem"])
            op = CompiledOp(
                problem=problem,
                target=meta["target"],
                stages={s: files[f"{s}.mlir"].decode() for s in meta["stages"]},
                vmfb=files["kernel.vmfb"],
                pipeline=meta["pipeline"],
                flags=list(meta["flags"]),
                iree_version=meta["iree_version"],
                # its workspace and determinism are sized for the problem, not stored (as CompiledOp.load)
                plan=plan_properties(problem, Plan.from_dict(meta["plan"])) if meta["plan"] else None,
                launch=_launch(files) if meta["launch"] else None,  # the direct CUDA or HIP launch
            )
            if json.loads(json.dumps(op.problem.to_dict())) != meta["problem"]:
                raise ValueError("its problem does not read back as stored")
        except FileNotFoundError:
            if not entry.exists():  # evicted or replaced while we read: a plain miss
                return None
            raise _Corrupt("a file is missing") from None
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as e:
            raise _Corrupt(str(e) or type(e).__name__) from None
        try:
            os.utime(meta_path)  # least recently used eviction reads this
        except OSError:
            pass
        return op

    def _discard(self, key: str, why: str) -> None:
        """Move a corrupt entry away; the caller holds ``key``'s lock (filelock is not re-entrant across
        lock objects: a second lock here would wait for ourselves)."""
        warnings.warn(f"cache: entry {key[:16]} in {self.root} is corrupt ({why}): rebuilding it", stacklevel=3)
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
    def put(self, key: str, op: CompiledOp, variant: dict[str, Any] | None = None,
            request: dict[str, Any] | None = None) -> Path:  # fmt: skip
        """Store ``op`` under ``key`` (replacing what is there); returns the entry's folder. ``request``:
        what ``key`` hashes (:func:`convbw_mlir.dispatch.variants.variant_request`), checked on every hit.

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
        if request is not None:
            meta["request"] = request
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

    def get_or_build(self, key: str, build: Callable[[], CompiledOp], variant: dict[str, Any] | None = None,
                     request: dict[str, Any] | None = None) -> tuple[CompiledOp, bool]:  # fmt: skip
        """``(op, hit)``: the cached op, or ``build()``'s result stored under ``key``. Processes building
        one key at once compile it once: the others wait on its lock and read the entry.

        A cache that cannot be made or written (a root under a file or a read-only folder, a full disk) is a
        warning: the op is returned, uncached.

        Raises:
            CacheTrustError: the root is not private to the user.
            ValueError: the root is a file or a folder that is not this cache.
        """
        try:
            self._setup()  # a root that cannot be made (under a file, a read-only folder): compiled uncached
            op = self.get(key)
            if op is not None:
                return op, True
            lock = self._lock(key)
            lock.acquire()
        except CacheTrustError:
            raise
        except (CacheError, OSError) as e:  # a read-only or full cache: still compile
            why = e if isinstance(e, CacheError) else f"cache: cannot write {self.root}: {e.strerror or e}"
            warnings.warn(f"{why} (compiling without the cache)", stacklevel=2)
            return build(), False
        try:
            try:
                op = self._hit(key)  # built by another process while we waited
            except _Corrupt as e:
                self._discard(key, str(e))  # under the lock we hold
                op = None
            if op is not None:
                return op, True
            op = build()
            try:
                self.put(key, op, variant, request)
            except (CacheError, OSError) as e:
                warnings.warn(str(e), stacklevel=2)
        finally:
            lock.release()
        return op, False

    # -- maintenance ---------------------------------------------------------------------------------
    def _entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of each entry (only folders named as the cache names them)."""
        out = []
        for meta in (self.root / "entries").glob("*/*/meta.json"):
            entry = meta.parent
            if not (KEY_RE.fullmatch(entry.name) and entry.parent.name == entry.name[:2]):
                continue
            try:
                st = meta.stat()
                size = sum(f.stat().st_size for f in entry.iterdir())
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, size, entry))
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
        """Entries and bytes; creates nothing (a root that does not exist has none).

        Raises:
            ValueError: the root is a file or a folder that is not this cache.
            CacheTrustError: the root is not private to the user.
        """
        if not self._claim(create=False):
            return CacheInfo(self.root, 0, 0, self.max_bytes)
        entries = self._entries()
        return CacheInfo(self.root, len(entries), sum(size for _, size, _ in entries), self.max_bytes)

    def clear(self) -> int:
        """Remove every entry, stale temporary and torch switch verdict (only names the cache wrote: entries,
        ``tmp/`` temporaries, :mod:`convbw_mlir.dispatch.verdicts`' files); returns how many entries (the verdicts
        removed: :attr:`verdicts_cleared`).

        Raises:
            ValueError: the root is a file or a folder that is not this cache (nothing is removed).
            CacheTrustError: the root is not private to the user.
        """
        self.verdicts_cleared = 0
        if not self._claim(create=False):
            return 0
        verdicts = self.root / VERDICTS
        if verdicts.is_dir() and not verdicts.is_symlink():
            for f in verdicts.iterdir():
                if VERDICT_RE.fullmatch(f.name) and f.is_file() and not f.is_symlink():
                    f.unlink(missing_ok=True)
                    self.verdicts_cleared += 1
        entries = self._entries()
        if entries:
            (self.root / "tmp").mkdir(exist_ok=True, mode=0o700)  # where _remove moves an entry first
        for _, _, entry in entries:
            self._remove(entry)
        tmp = self.root / "tmp"
        for stale in tmp.iterdir() if tmp.is_dir() else ():
            if TEMP_RE.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        return len(entries)


def _launch(files: dict[str, bytes]) -> Any:
    """The direct CUDA launch's schedule among an entry's (checked) files."""
    from convbw_mlir.cuda_launch import Launch

    return Launch.from_files(files.__getitem__)
