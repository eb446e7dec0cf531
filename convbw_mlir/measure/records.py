"""The runner's records at its file and process boundaries: a manifest entry (what the compile side wrote for
one problem: its kernels) and a result row (what the runner measured of it). Each reads from and writes to
the JSON the runner has always read and written, field for field and in the same order, so existing
manifests and results read, and a result written today is byte-identical to one written before these
records (tests/test_measure_records.py reads committed ones back).

A contender's record (``ok``, ``vmfb``, ``launch``, ``config`` ...) and a contender's result (``status``,
``median_s``, errors ...) stay string-keyed: each kind of contender and each check adds its own fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ManifestEntry", "ResultRow"]


def _require(d: Any, what: str, fields: Mapping[str, type | tuple[type, ...]]) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{what}: expected an object, got {type(d).__name__}")
    for name, kind in fields.items():
        if name not in d:
            raise ValueError(f"{what}: missing field {name!r}")
        if not isinstance(d[name], kind) or (isinstance(d[name], bool) and bool not in _types(kind)):
            raise ValueError(f"{what}: {name}: expected {_names(kind)}, got {d[name]!r}")


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _types(kind))


@dataclass(frozen=True)
class ManifestEntry:
    """One problem of a manifest (``manifest.json``'s ``problems``): its name, its unique ``key``, the
    problem (``ConvBwdWeightProblem.to_dict``), each contender's record by name, and the fields a writer
    adds of its own (the tuner's ``held_out``, the fuzz's ``class``, the untuned path's ``selected``), in
    their order; in JSON they stand between ``key`` and ``problem``."""

    name: str
    key: str
    problem: dict[str, Any]
    contenders: dict[str, dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def held_out(self) -> bool:
        """Whether the tuner holds this problem out of tuning (its manifest says so)."""
        return bool(self.extra.get("held_out", False))

    def conv(self) -> Any:
        """The problem as a :class:`convbw_mlir.problem.ConvBwdWeightProblem`."""
        from convbw_mlir.problem import ConvBwdWeightProblem

        return ConvBwdWeightProblem.from_dict(self.problem)

    def with_contenders(self, contenders: Mapping[str, dict[str, Any]], **extra: Any) -> ManifestEntry:
        """This entry with other contenders (and ``extra`` fields added or replaced)."""
        return ManifestEntry(self.name, self.key, self.problem, dict(contenders), {**self.extra, **extra})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, **self.extra, "problem": self.problem,
                "contenders": self.contenders}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str = "manifest entry") -> ManifestEntry:
        """Raises ValueError naming ``where`` and the field: not an object, a field missing or mistyped."""
        _require(d, where, {"name": str, "key": str, "problem": dict, "contenders": dict})
        extra = {k: v for k, v in d.items() if k not in ("name", "key", "problem", "contenders")}
        return cls(d["name"], d["key"], d["problem"], d["contenders"], extra)


# The fields of a row that come from the problem alone, in the order a row holds them.
_HEAD = ("name", "key", "flops", "bytes", "depthwise_or_grouped", "reduction_length")


@dataclass(frozen=True)
class ResultRow:
    """One problem's results (a results file's ``problems``): the problem's own fields, the reference's
    fields (``reference_check``, ``reference_checked``, ``reference_error``), each contender's result by
    name, the device that measured it, the roofline, and the fields a caller adds after (the tuner's
    ``held_out``, ``variants``, ``pass2`` ..., the fuzz's ``class``), in their order.

    ``device_index`` is written only where the run had several devices (``several_devices``); it is None for a
    problem whose measuring worker died. ``reduction_length`` and ``roofline_s`` are written where known.
    """

    name: str
    key: str
    flops: int
    bytes: int
    depthwise_or_grouped: bool
    contenders: dict[str, dict[str, Any]]
    reduction_length: int | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    device_index: int | None = None
    several_devices: bool = False
    roofline_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def head(cls, entry: ManifestEntry, contenders: dict[str, dict[str, Any]],
             reference: dict[str, Any] | None = None) -> ResultRow:  # fmt: skip
        """The row of ``entry`` with these results: its problem's fields computed."""
        p = entry.conv()
        return cls(entry.name, entry.key, p.flops, p.min_bytes, p.groups > 1, contenders, p.gemm[3],
                   dict(reference or {}))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "key": self.key, "flops": self.flops, "bytes": self.bytes,
                             "depthwise_or_grouped": self.depthwise_or_grouped}  # fmt: skip
        if self.reduction_length is not None:
            d["reduction_length"] = self.reduction_length
        d |= self.reference
        d["contenders"] = self.contenders
        if self.several_devices:
            d["device_index"] = self.device_index
        if self.roofline_s is not None:
            d["roofline_s"] = self.roofline_s
        return d | self.extra

    @classmethod
    def from_dict(cls, d: Any, where: str = "result row") -> ResultRow:
        """Raises ValueError naming ``where`` and the field: not an object, a field missing or mistyped.

        Fields after ``contenders`` other than ``device_index`` and ``roofline_s`` (in that order, right
        after it) are kept as ``extra``, in their order; so is any field before it that a row never had."""
        _require(d, where, {"name": str, "key": str, "flops": int, "bytes": int, "depthwise_or_grouped": bool,
                            "contenders": dict})  # fmt: skip
        keys = list(d)
        at = keys.index("contenders")
        reference = {k: d[k] for k in keys[:at] if k.startswith("reference_")}
        extra = {k: d[k] for k in keys[:at] if k not in _HEAD and k not in reference and k != "roofline_s"}
        tail = keys[at + 1 :]
        own = []  # device_index, then roofline_s, where they follow contenders directly
        for name in ("device_index", "roofline_s"):
            if tail[len(own) : len(own) + 1] == [name]:
                own.append(name)
        extra |= {k: d[k] for k in tail[len(own) :]}
        roofline = d.get("roofline_s") if "roofline_s" in own or "roofline_s" in keys[:at] else None
        return cls(d["name"], d["key"], d["flops"], d["bytes"], d["depthwise_or_grouped"], d["contenders"],
                   d.get("reduction_length"), reference, d.get("device_index") if "device_index" in own else None,
                   "device_index" in own, roofline, extra)  # fmt: skip
