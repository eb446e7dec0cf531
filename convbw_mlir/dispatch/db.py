"""The tuning database: measured winners per problem, one JSON file per device name + target.

    {"format": 1, "kind": "convbw-mlir tuning database", "device": "NVIDIA H100 80GB HBM3",
     "target": "sm_80", "iree_version": "3.13.0", "product_version": "0.1.0",
     "entries": [{"name": ..., "problem": {...}, "variant": {...}, "median_s": ..., "heuristic_s": ...,
                  "iree_best": {...}, "runner_up": {...}, "noise": ..., "why": ..., "measured": "2026-11-23"}]}

Human-readable (sorted, indented), mergeable (:meth:`TuningDB.merge`: per problem, the faster
measurement wins), versioned: a database from another IREE version is ignored with a warning, never used
silently. Files are written atomically. A database names no files: it holds plans, not kernels.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.variants import Variant, product_version
from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["DatabaseError", "TuningDB", "db_file_name", "problem_key"]

FORMAT = 1
KIND = "convbw-mlir tuning database"


class DatabaseError(ValueError):
    """A malformed tuning database (the message names the file and the entry)."""


def problem_key(problem: ConvBwdWeightProblem) -> str:
    """The exact identity of a problem in a database: its fields as sorted JSON."""
    return json.dumps(problem.to_dict(), sort_keys=True)


def db_file_name(device: str, target: str) -> str:
    """``nvidia-h100-80gb-hbm3.sm_80.json``: the device name folded to a file name, and the target."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
    return f"{slug}.{target}.json"


@dataclass
class TuningDB:
    """One device's winners for one target (see the module docstring)."""

    device: str
    target: str
    iree_version: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # by problem_key
    product_version: str = field(default_factory=product_version)
    path: Path | None = None

    def add(self, problem: ConvBwdWeightProblem, variant: Variant, **fields: Any) -> None:
        """Record ``variant`` as the winner for ``problem`` with its measurements ``fields``."""
        entry = {"name": problem.name, "problem": problem.to_dict(), "variant": variant.to_dict(), **fields}
        self.entries[problem_key(problem)] = json.loads(json.dumps(entry))  # as a saved file holds it

    def problems(self) -> dict[str, ConvBwdWeightProblem]:
        """Each entry's problem, parsed once (select's nearest-neighbour loop reads them on every call)."""
        cached = getattr(self, "_problems", None)
        if cached is None or cached[0] != len(self.entries):
            parsed = {k: ConvBwdWeightProblem.from_dict(e["problem"]) for k, e in self.entries.items()}
            cached = (len(self.entries), parsed)
            object.__setattr__(self, "_problems", cached)
        return cached[1]

    def lookup(self, problem: ConvBwdWeightProblem) -> dict[str, Any] | None:
        return self.entries.get(problem_key(problem))

    def merge(self, other: TuningDB) -> int:
        """Take ``other``'s entries where this has none or a slower one; returns how many were taken.

        Raises:
            DatabaseError: ``other`` is for another device, target or IREE version.
        """
        for name in ("device", "target", "iree_version"):
            if getattr(self, name) != getattr(other, name):
                raise DatabaseError(f"merge: {name} differs: {getattr(self, name)!r} vs {getattr(other, name)!r}")
        taken = 0
        for key, entry in other.entries.items():
            mine = self.entries.get(key)
            if mine is None or _better(entry, mine):
                self.entries[key] = entry
                taken += 1
        return taken

    def to_json(self) -> str:
        data = {
            "format": FORMAT,
            "kind": KIND,
            "device": self.device,
            "target": self.target,
            "iree_version": self.iree_version,
            "product_version": self.product_version,
            "entries": sorted(self.entries.values(), key=lambda e: e["name"]),
        }
        return json.dumps(data, indent=1) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a temporary file renamed over ``path``)."""
        from convbw_mlir.files import write_atomic

        write_atomic(str(path), self.to_json())
        self.path = Path(path)
        return self.path

    @classmethod
    def parse(cls, text: str | bytes, source: str = "<database>") -> TuningDB:
        """A database from its JSON; checks every entry (its problem and variant parse).

        Raises:
            DatabaseError: malformed JSON, an unknown format, a missing field or a bad entry.
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatabaseError(f"tuning database {source}: not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise DatabaseError(f"tuning database {source}: not a convbw-mlir tuning database (kind)")
        if data.get("format") != FORMAT:
            raise DatabaseError(f"tuning database {source}: format {data.get('format')!r}, expected {FORMAT}")
        try:
            db = cls(str(data["device"]), str(data["target"]), str(data["iree_version"]),
                     product_version=str(data.get("product_version", "")))  # fmt: skip
            entries = data["entries"]
        except KeyError as e:
            raise DatabaseError(f"tuning database {source}: missing field {e}") from None
        if not isinstance(entries, list):
            raise DatabaseError(f"tuning database {source}: entries: expected a list")
        for i, entry in enumerate(entries):
            try:
                problem = ConvBwdWeightProblem.from_dict(entry["problem"])
                variant = Variant.from_dict(entry["variant"])
                if variant.plan is not None and variant.plan.target != db.target:
                    raise ValueError(f"plan for {variant.plan.target}, database for {db.target}")
            except (KeyError, TypeError, ValueError) as e:
                raise DatabaseError(f"tuning database {source}: entries[{i}]: {type(e).__name__}: {e}") from None
            db.entries[problem_key(problem)] = entry
        return db

    @classmethod
    def load(cls, path: str | os.PathLike, iree_version: str | None = None) -> TuningDB | None:
        """Read ``path``; None (with a warning) where it was measured with another IREE version.

        Raises:
            DatabaseError: a malformed file. FileNotFoundError: no such file.
        """
        path = Path(path)
        db = cls.parse(path.read_bytes(), str(path))
        db.path = path
        if iree_version is not None and db.iree_version != iree_version:
            warnings.warn(f"tuning database {path}: measured with IREE {db.iree_version}, this is {iree_version}: "
                          "ignored", stacklevel=2)  # fmt: skip
            return None
        return db


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether ``new`` replaces ``old``: a GPU kernel time (``metric: kernel_s``) beats a time through IREE's
    runtime (the older entries: docs/decisions.md#kernel-time); times of one kind compare."""
    inf = float("inf")
    kinds = new.get("metric", "median_s"), old.get("metric", "median_s")
    if kinds[0] != kinds[1]:
        return kinds[0] == "kernel_s"
    return new.get("median_s", inf) < old.get("median_s", inf)
