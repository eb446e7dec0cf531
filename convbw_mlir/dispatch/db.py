"""The tuning database: measured winners per problem, one JSON file per device name + target.

    {"format": 1, "kind": "convbw-mlir tuning database", "device": "NVIDIA H100 80GB HBM3",
     "target": "sm_80", "iree_version": "3.13.0", "product_version": "0.1.0",
     "entries": [{"name": ..., "problem": {...}, "variant": {...}, "median_s": ..., "heuristic_s": ...,
                  "iree_best": {...}, "runner_up": {...}, "noise": ..., "why": ..., "measured": "2026-11-23",
                  "cudnn_s": ...}]}

Human-readable (sorted, indented), mergeable (:meth:`TuningDB.merge`: per problem, the faster
measurement wins), versioned: a database from another IREE version is ignored with a warning, never used
silently. Files are written atomically. A database names no files: it holds plans, not kernels.

Checked at parse (:data:`ENTRY_FIELDS`): the header's fields (``device`` a name, ``target`` one of the
target table's, which is all a file name is made of), and each entry's: its problem and variant parse
(a plan for the database's target), its name is its problem's name, its times are positive finite numbers,
its other fields have their types. A reader (:func:`convbw_mlir.dispatch.select.databases`) ignores a bad
entry with a warning naming the file and the entry; ``convbw tune --import`` refuses the whole file.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convbw_mlir.dispatch.variants import IREE_FORMS, Variant, product_version
from convbw_mlir.problem import ConvBwdWeightProblem
from convbw_mlir.targets import TARGETS

__all__ = ["ENTRY_FIELDS", "DatabaseError", "TuningDB", "check_entry", "check_header", "db_file_name", "problem_key"]

FORMAT = 1
KIND = "convbw-mlir tuning database"


class DatabaseError(ValueError):
    """A malformed tuning database (the message names the file and the entry)."""


def problem_key(problem: ConvBwdWeightProblem) -> str:
    """The exact identity of a problem in a database: its fields as sorted JSON."""
    return json.dumps(problem.to_dict(), sort_keys=True)


def db_file_name(device: str, target: str) -> str:
    """``nvidia-h100-80gb-hbm3.sm_80.json``: the device name folded to a file name, and the target.

    Raises:
        DatabaseError: ``target`` is not in the target table (so no name leaves the database folder).
    """
    if target not in TARGETS:
        raise DatabaseError(f"target: unknown target {target!r}; known: {', '.join(TARGETS)}")
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
    return f"{slug}.{target}.json"


def _seconds(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0):
        return f"expected a positive number of seconds, got {v!r}"
    return None


def _fraction(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v >= 0):
        return f"expected a number >= 0, got {v!r}"
    return None


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and v else f"expected a non-empty string, got {v!r}"


def _or_none(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda v: None if v is None else check(v)


def _one_of(*values: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in values else f"expected one of {', '.join(values)}, got {v!r}"


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {v!r}"


def _iree_best(v: Any) -> str | None:
    if not isinstance(v, dict) or set(v) != {"form", "median_s"}:
        return f"expected {{form, median_s}}, got {v!r}"
    return _one_of(*IREE_FORMS)(v["form"]) or _seconds(v["median_s"])


def _parsed(kind: Callable[[Any], Any]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"expected an object, got {v!r}"
        try:
            kind(v)
        except (TypeError, ValueError) as e:
            return str(e)
        return None

    return check


# An entry's fields: whether required, and the check of its value (an error message, or None).
# ``problem`` and ``variant`` are checked by their own parsers; other fields are kept as they are.
ENTRY_FIELDS: dict[str, tuple[bool, Callable[[Any], str | None]]] = {
    "name": (True, _text),
    "problem": (True, _parsed(ConvBwdWeightProblem.from_dict)),
    "variant": (True, _parsed(Variant.from_dict)),
    "median_s": (True, _seconds),
    "heuristic_s": (False, _or_none(_seconds)),
    "noise": (False, _or_none(_fraction)),
    "flipped": (False, _or_none(_flag)),
    "runner_up": (False, _or_none(_text)),
    "why": (False, _or_none(lambda v: None if isinstance(v, str) else f"expected a string, got {v!r}")),
    "metric": (False, _one_of("median_s", "kernel_s")),
    "iree_best": (False, _or_none(_iree_best)),
    "measured": (False, _or_none(_text)),
    "cudnn_s": (False, _or_none(_seconds)),  # cuDNN's time on the problem, same run and metric as median_s
}


def check_entry(entry: Any, target: str) -> tuple[ConvBwdWeightProblem, Variant]:
    """An entry's problem and variant, after checking every field of :data:`ENTRY_FIELDS`.

    Raises:
        ValueError: the first bad field, named with its value (a plan for another target, a name that is
            not its problem's, too).
    """
    if not isinstance(entry, dict):
        raise ValueError(f"expected an object, got {entry!r}")
    for name, (required, check) in ENTRY_FIELDS.items():
        if name not in entry:
            if required:
                raise ValueError(f"missing field {name!r}")
            continue
        error = check(entry[name])
        if error is not None:
            raise ValueError(f"{name}: {error}")
    variant = Variant.from_dict(entry["variant"])
    if variant.plan is not None and variant.plan.target != target:
        raise ValueError(f"variant: a plan for {variant.plan.target}, in a database for {target}")
    problem = ConvBwdWeightProblem.from_dict(entry["problem"])
    if entry["name"] != problem.name:  # a database names each entry by its problem: one that disagrees is not it
        raise ValueError(f"name: {entry['name']!r} is not the name of the entry's problem, {problem.name!r}")
    return problem, variant


def check_header(data: dict[str, Any], source: str) -> tuple[str, str, str, str]:
    """device, target, iree_version, product_version of a database's (or a results file's) header.

    Raises:
        DatabaseError: a missing or bad field, naming ``source``, the field and its value.
    """
    out = []
    for name, required in (("device", True), ("target", True), ("iree_version", True), ("product_version", False)):
        if name not in data and not required:
            out.append("")
            continue
        if name not in data:
            raise DatabaseError(f"{source}: missing field {name!r}")
        value = data[name]
        if not isinstance(value, str) or (required and not value):
            raise DatabaseError(f"{source}: {name}: expected a non-empty string, got {value!r}")
        out.append(value)
    if out[1] not in TARGETS:
        raise DatabaseError(f"{source}: target: unknown target {out[1]!r}; known: {', '.join(TARGETS)}")
    return out[0], out[1], out[2], out[3]


@dataclass
class TuningDB:
    """One device's winners for one target (see the module docstring)."""

    device: str
    target: str
    iree_version: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # by problem_key
    product_version: str = field(default_factory=product_version)
    path: Path | None = None

    def __post_init__(self) -> None:
        check_header(vars(self), "tuning database")

    def add(self, problem: ConvBwdWeightProblem, variant: Variant, **fields: Any) -> None:
        """Record ``variant`` as the winner for ``problem`` with its measurements ``fields``.

        Raises:
            ValueError: a field :func:`check_entry` refuses (naming it and its value).
        """
        entry = {"name": problem.name, "problem": problem.to_dict(), "variant": variant.to_dict(), **fields}
        entry = json.loads(json.dumps(entry))  # as a saved file holds it
        check_entry(entry, self.target)
        self.entries[problem_key(problem)] = entry

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
    def parse(cls, text: str | bytes, source: str = "<database>", strict: bool = True) -> TuningDB:
        """A database from its JSON; checks the header and every entry (:func:`check_entry`).

        Args:
            strict: a bad entry refuses the whole file; False: it is left out, with a warning naming
                ``source`` and the entry (how readers such as ``select`` take a database).

        Raises:
            DatabaseError: malformed JSON, an unknown format, a missing or bad header field, or (strict)
                a bad entry; each naming ``source``.
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatabaseError(f"tuning database {source}: not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise DatabaseError(f"tuning database {source}: not a convbw-mlir tuning database (kind)")
        if data.get("format") != FORMAT:
            raise DatabaseError(f"tuning database {source}: format {data.get('format')!r}, expected {FORMAT}")
        device, target, iree, product = check_header(data, f"tuning database {source}")
        db = cls(device, target, iree, product_version=product)
        if "entries" not in data:
            raise DatabaseError(f"tuning database {source}: missing field 'entries'")
        entries = data["entries"]
        if not isinstance(entries, list):
            raise DatabaseError(f"tuning database {source}: entries: expected a list, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            try:
                problem, _ = check_entry(entry, target)
            except (TypeError, ValueError) as e:
                name = entry.get("name") if isinstance(entry, dict) else None
                where = f"tuning database {source}: entries[{i}]" + (f" ({name})" if isinstance(name, str) else "")
                if strict:
                    raise DatabaseError(f"{where}: {e}") from None
                warnings.warn(f"{where}: {e}: entry ignored", stacklevel=2)
                continue
            key = problem_key(problem)
            if key not in db.entries or _better(entry, db.entries[key]):
                db.entries[key] = entry
        return db

    @classmethod
    def load(cls, path: str | os.PathLike, iree_version: str | None = None, strict: bool = False) -> TuningDB | None:
        """Read ``path``; None (with a warning) where it was measured with another IREE version.

        Args:
            strict: as :meth:`parse`; by default a bad entry is left out with a warning.

        Raises:
            DatabaseError: a malformed file. OSError: it cannot be read.
        """
        path = Path(path)
        db = cls.parse(path.read_bytes(), str(path), strict)
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
