"""The torch switch's remembered verdicts: which side computes a layer's weight gradient faster, ours or torch's
(cuDNN's wgrad), as measured once on first use, so that a later process decides without timing.

Where: ``<cache root>/verdicts/<sha256 of the key>.json`` in the kernel cache's folder
(:func:`convbw_mlir.dispatch.cache.default_cache_dir`; claimed and tagged as the cache claims it), one small file a
key, written atomically (a temporary file renamed over it: a reader sees the old verdict or the new one, never
half of one; two processes measuring one key at once both write a whole verdict and the last one stays).
``convbw cache clear`` removes them with the kernels (:data:`convbw_mlir.dispatch.cache.VERDICT_RE` names the files
it may remove).

A key is a dict of strings and plain values, everything the two times depend on (the torch switch builds it:
problem, target, device name, torch and cuDNN versions, our kernel's identity, the copies around it, torch's
algorithm settings). A file stores its whole key and is a hit only for that key: a file that is not JSON, not a
verdict, of another format, for another key (foreign) or of bad fields is a miss with one warning; the caller
measures again and its verdict replaces the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.cache import VERDICT_RE, VERDICTS, CacheError, KernelCache
from convbw_mlir.files import write_atomic

FOLDER = VERDICTS
__all__ = ["FOLDER", "VERDICT_RE", "Verdict", "VerdictStore", "verdict_file_name"]

FORMAT = 1
KIND = "convbw-mlir switch verdict"


@dataclass(frozen=True)
class Verdict:
    """Whether our weight gradient is used, and the two times that decided it (seconds for the timed calls)."""

    ours: bool
    ours_s: float
    torch_s: float


def verdict_file_name(key: dict[str, Any]) -> str:
    """The file a key's verdict is stored in: the sha256 of the key as sorted JSON."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest() + ".json"


def _seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0


class VerdictStore:
    """Verdicts in ``<root>/verdicts`` (``root``: the kernel cache's folder, default the user's).

    Reads never raise: an unreadable or malformed file is a warning and a miss. A write that fails (a read-only
    or full disk, a cache folder that is not ours) is one warning, and the verdict stays in this process only.
    """

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self._cache = KernelCache(root)
        self.folder = self._cache.root / FOLDER

    def __repr__(self) -> str:
        return f"VerdictStore({str(self._cache.root)!r})"

    def path(self, key: dict[str, Any]) -> Path:
        return self.folder / verdict_file_name(key)

    def get(self, key: dict[str, Any]) -> Verdict | None:
        """The verdict stored for ``key``; None where there is none, or (with a warning) where its file is not a
        verdict for ``key``."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # none stored (or no folder: put() says why)
            return None
        except OSError as e:
            warnings.warn(f"switch verdict {path}: cannot be read ({e.strerror or e}): measuring again", stacklevel=3)
            return None
        try:
            return _parse(raw, key)
        except ValueError as e:
            warnings.warn(f"switch verdict {path}: {e}: measuring again", stacklevel=3)
            return None

    def put(self, key: dict[str, Any], verdict: Verdict) -> Path | None:
        """Store ``verdict`` for ``key`` (replacing what is there); the file, or None (warned) where it cannot."""
        measured = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record = {"format": FORMAT, "kind": KIND, "key": key, "ours": verdict.ours, "ours_s": verdict.ours_s,
                  "torch_s": verdict.torch_s, "measured": measured}  # fmt: skip
        try:
            self._cache._setup()  # the cache's own claim: a folder of ours (tagged), private to the user
            self.folder.mkdir(exist_ok=True, mode=0o700)
            path = self.path(key)
            write_atomic(str(path), json.dumps(record, indent=1, sort_keys=True) + "\n")
        except (CacheError, OSError, ValueError) as e:  # CacheTrustError is a CacheError
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            warnings.warn(f"switch verdict not remembered in {self.folder}: {why}", stacklevel=3)
            return None
        return path


def _parse(raw: bytes, key: dict[str, Any]) -> Verdict:
    """The verdict in ``raw`` if it is one for ``key``.

    Raises:
        ValueError: why it is not (not JSON, not a verdict, another format or key, a bad field).
    """
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("not JSON (corrupt)") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError("not a convbw-mlir switch verdict")
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
    if data.get("key") != json.loads(json.dumps(key)):
        raise ValueError("stored for another key (foreign)")
    if not isinstance(data.get("ours"), bool):
        raise ValueError(f"ours: expected true or false, got {data.get('ours')!r}")
    for name in ("ours_s", "torch_s"):
        if not _seconds(data.get(name)):
            raise ValueError(f"{name}: expected a number of seconds >= 0, got {data.get(name)!r}")
    return Verdict(data["ours"], float(data["ours_s"]), float(data["torch_s"]))
