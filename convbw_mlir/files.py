"""Writing outputs so that a failure leaves nothing half-written and no user file is lost, and versioned
artifact folders.

Every output folder (``--out``, ``--into``, ``--cache-dir``, :meth:`CompiledOp.save`) goes through
:func:`claim_folder` first: a path that is a file or a link, or a folder holding anything its writer did
not write, is refused naming what is there. :func:`atomic_directory` marks what it writes
(:data:`OUTPUT_MARK` lists the names), so that only such an earlier output is replaced.

A versioned folder (:func:`write_versioned`, :func:`read_versioned`) holds an index file and immutable
``v-<32 hex>`` subfolders. A save writes a new subfolder, then replaces the index with ``os.replace``;
a reader reads the index, then the subfolder it names, and reads again if a newer save removed that
subfolder meanwhile. Saves take a file lock inside the folder, so concurrent saves queue (the last one
wins) and none removes a subfolder another save is still writing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

__all__ = [
    "ForeignEntryError",
    "OUTPUT_MARK",
    "atomic_directory",
    "check_output",
    "claim_folder",
    "record_output",
    "read_versioned",
    "write_atomic",
    "write_versioned",
]

T = TypeVar("T")

VERSION_RE = re.compile(r"v-[0-9a-f]{32}")
LOCK_NAME = ".save.lock"
# Written by atomic_directory in the folder it makes: the names it (and later record_output calls) wrote.
OUTPUT_MARK = ".convbw-output.json"
# A reader retries only while the index keeps changing (each retry means another save completed).
READ_ATTEMPTS = 100


class ForeignEntryError(ValueError):
    """A save was refused because the folder holds something no save wrote."""


def claim_folder(
    path: str | os.PathLike, what: str, ours: Callable[[str], bool], writer: str = "convbw did not write"
) -> Path:
    """The check of every output folder before anything is written or removed in it.

    Args:
        path: the folder (it may not exist yet).
        what: the option or role named in errors (``--out``, ``artifact``, ``cache``).
        ours: whether a name found in the folder is one its writer may replace.
        writer: what the error says of a foreign name.

    Raises:
        ValueError: ``path`` exists and is not a folder.
        ForeignEntryError: the folder holds a name ``ours`` refuses (the message names it).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}: {folder} exists and is not a folder")
    if folder.is_dir():
        foreign = [name for name in sorted(os.listdir(folder)) if not ours(name)]
        if foreign:
            more = f" ({len(foreign) - 1} more such entries)" if len(foreign) > 1 else ""
            raise ForeignEntryError(f"{what}: {folder} holds {foreign[0]!r}, which {writer}{more}; "
                                    "refusing to write there (use a new or empty folder)")  # fmt: skip
    return folder


def _marked_names(folder: Path) -> set[str]:
    """The names an earlier :func:`atomic_directory` output recorded in ``folder`` (empty: none)."""
    import json

    try:
        names = json.loads((folder / OUTPUT_MARK).read_text()).get("names")
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return set()
    return {OUTPUT_MARK, *names}


def _write_mark(folder: Path, names: Collection[str]) -> None:
    import json

    _replace_file(folder / OUTPUT_MARK, (json.dumps({"names": sorted(names)}) + "\n").encode())


def record_output(folder: str | os.PathLike, *names: str) -> None:
    """Add ``names`` (files a later step wrote into an :func:`atomic_directory` output) to its mark, so that
    the next output into ``folder`` may replace them."""
    folder = Path(folder)
    _write_mark(folder, (_marked_names(folder) - {OUTPUT_MARK}) | set(names))


def _umask() -> int:
    # os.umask can only be read by setting it; set it straight back.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: Path) -> None:
    # Makes a rename or a new entry in ``path`` durable; not possible on Windows (no O_DIRECTORY).
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_prefix(name: str) -> str:
    return f".{name}."


def _replace_file(target: Path, raw: bytes) -> None:
    """Write ``raw`` to a temporary file beside ``target``, flush it to disk, then rename it over ``target``."""
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())  # the data must be on disk before the rename makes it visible
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_output(path: str | os.PathLike, what: str = "--out") -> Path:
    """Check that :func:`atomic_directory` may replace ``path`` (absent, empty, or an earlier output of it):
    the CLIs call it before a long build, so that a refusal comes first.

    Raises:
        ValueError: ``path`` is a file, or a folder holding anything its mark does not list (named).
    """
    return claim_folder(path, what, _marked_names(Path(path)).__contains__)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, what: str = "--out") -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path``, on error it is removed.
    The folder gets the usual permissions (0777 less the umask) and a mark listing the names written.

    Raises:
        ValueError: ``path`` is a file, or a folder holding anything but an earlier output of
            this function (the names its mark lists), checked before and again after the work (``what``
            is the option named).
    """
    path = check_output(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        yield tmp
        _write_mark(tmp, os.listdir(tmp))
        check_output(path, what)  # a long build: the folder may have changed meanwhile
        if not path.exists():
            tmp.rename(path)
            return
        # Moved aside rather than deleted first, so that a failing rename can put the old folder back.
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        try:
            path.rename(aside / path.name)
            try:
                tmp.rename(path)
            except BaseException:
                (aside / path.name).rename(path)
                raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_atomic(path: str, data: bytes | str) -> None:
    """Write ``path`` through a temporary file beside it; ``-`` is stdout. A device or fifo (/dev/null)
    is written through, never replaced."""
    raw = data.encode() if isinstance(data, str) else data
    if path == "-":
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        return
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(target, "wb") as f:
            f.write(raw)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace_file(target, raw)


def _owned_names(folder: Path, index_name: str, legacy_names: Callable[[bytes], Collection[str]]) -> set[str]:
    """Names in ``folder`` other than versions, the lock and temporaries that a save may replace.

    Raises:
        ForeignEntryError: the index file is not one of ours.
    """
    index = folder / index_name
    if not index.is_file():
        return set()
    try:
        return {index_name, *legacy_names(index.read_bytes())}
    except ValueError:
        raise ForeignEntryError(
            f"artifact: {folder} holds {index_name!r}, which no save wrote; refusing to save there "
            "(use a new or empty folder)"
        ) from None


def _is_ours(name: str, index_name: str, owned: set[str]) -> bool:
    temp = re.escape(_temp_prefix(index_name)) + r"\w+\.tmp"
    return name in owned or name == LOCK_NAME or bool(VERSION_RE.fullmatch(name) or re.fullmatch(temp, name))


def _check_ours(folder: Path, index_name: str, legacy_names: Callable[[bytes], Collection[str]]) -> set[str]:
    """The legacy names of ``folder``'s artifact; raises ForeignEntryError naming one entry that is not ours."""
    owned = _owned_names(folder, index_name, legacy_names)
    claim_folder(folder, "artifact", lambda name: _is_ours(name, index_name, owned), writer="no save wrote")
    return owned


def write_versioned(
    directory: str | os.PathLike,
    files: Mapping[str, bytes],
    index_name: str,
    index: Callable[[str], bytes],
    legacy_names: Callable[[bytes], Collection[str]] = lambda raw: (),
) -> Path:
    """Replace the contents of the versioned folder ``directory`` atomically; returns the new version's folder.

    ``files`` go into a new ``v-<32 hex>`` subfolder; then ``index(version_name)`` replaces
    ``directory/index_name``; then the older versions (and ``legacy_names(old index)``, the files of an
    unversioned layout) are removed. Concurrent saves queue on a lock file in ``directory``: each
    succeeds and the last one wins. A save that fails or is killed leaves the previous contents.

    Raises:
        ForeignEntryError: ``directory`` holds an entry that no save wrote (checked before anything is
            written there), or an index that ``legacy_names`` rejects with ValueError.
        ValueError: ``directory`` exists and is not a folder.
    """
    folder = Path(directory)
    if folder.exists():
        _check_ours(folder, index_name, legacy_names)  # before the lock file is created in it
    folder.mkdir(parents=True, exist_ok=True)
    # Imported here: loading an artifact needs no lock, and needs only the IREE runtime and numpy.
    from filelock import FileLock

    with FileLock(folder / LOCK_NAME):
        owned = _check_ours(folder, index_name, legacy_names)  # again: the folder may have changed
        version = f"v-{uuid.uuid4().hex}"
        target = folder / version
        target.mkdir()
        for name, raw in files.items():
            with open(target / name, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())  # the version must be complete on disk before the index names it
        _fsync_dir(target)
        _replace_file(folder / index_name, index(version))
        _fsync_dir(folder)
        # Older versions and crashed saves' leftovers; a reader still on one of them reads the index again.
        for entry in os.listdir(folder):
            path = folder / entry
            if entry == version or entry in (index_name, LOCK_NAME):
                continue
            if VERSION_RE.fullmatch(entry) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif _is_ours(entry, index_name, owned - {index_name}) and not path.is_dir():
                path.unlink(missing_ok=True)
    return target


def read_versioned(directory: str | os.PathLike, index_name: str, read: Callable[[bytes], T]) -> T:
    """``read(contents of directory/index_name)``, read again while a concurrent save changed the index.

    ``read`` raises FileNotFoundError when the version the index named is gone; that is retried as long
    as the index keeps changing, so a reader never mixes two saves' files and never sees a half-written one.

    Raises:
        FileNotFoundError: the index, or a file it names, does not exist (and no save replaced the index).
    """
    index = Path(directory) / index_name
    last: bytes | None = None
    error: FileNotFoundError | None = None
    for _ in range(READ_ATTEMPTS):
        raw = index.read_bytes()
        if raw == last and error is not None:
            raise error
        try:
            return read(raw)
        except FileNotFoundError as e:
            last, error = raw, e
    assert error is not None
    raise error
