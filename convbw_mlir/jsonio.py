"""Reading a JSON file a user names (a manifest, timing results): one error naming the file and what is wrong.

No compiler, no runtime: the GPU machine's runner and report use it too.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["read_json", "require_fields"]


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The parsed content of ``path``.

    Raises:
        ValueError: it cannot be read or is not JSON, naming ``what`` (e.g. ``manifest``) and ``path``.
    """
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what}: {path}: not JSON ({e})") from None


def require_fields(data: Any, fields: dict[str, type | tuple[type, ...]], source: str) -> dict[str, Any]:
    """``data`` itself, once it is an object holding each of ``fields`` with a value of its type.

    Raises:
        ValueError: not an object, or the first missing or mistyped field, naming ``source``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
    for name, kind in fields.items():
        if name not in data:
            raise ValueError(f"{source}: missing field {name!r}")
        if not isinstance(data[name], kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            want = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{source}: {name}: expected a {want}, got {data[name]!r}")
    return data
