"""A small TOML writer for config files (strings, numbers, booleans, arrays, nested tables).

The output is read back with ``tomllib`` before it is written, so a value it cannot express fails here
rather than in the harness.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any


def _key(name: str) -> str:
    bare = name and all(c.isalnum() or c in "-_" for c in name)
    return name if bare else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def dumps(data: dict[str, Any]) -> str:
    lines: list[str] = []

    def table(node: dict[str, Any], path: list[str]) -> None:
        scalars = {k: v for k, v in node.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in node.items() if isinstance(v, dict)}
        if path and (scalars or not tables):
            lines.append(("\n" if lines else "") + "[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        for k, v in tables.items():
            table(v, [*path, k])

    table(data, [])
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != json.loads(json.dumps(data)):
        raise ValueError("TOML writer did not round-trip")
    return text
