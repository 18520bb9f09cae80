"""Qwen3-Coder tool calls: XML-ish parameters, one per argument, values written raw.

A block is ``"<tool_call>\\n<function=NAME>\\n"``, then per argument ``"<parameter=KEY>\\n" + VALUE +
"\\n</parameter>\\n"``, then ``"</function>\\n</tool_call>"``, where a string VALUE is written as is and any
other value as ``json.dumps(value, ensure_ascii=False)``.

Reading a VALUE back needs the declared type: with the tool's JSON schema, a ``string`` parameter stays the raw
text; other types are JSON-parsed, falling back to the raw text when that fails (or, for a union with
``string``, when the parsed value is of an undeclared type). Without a type, JSON is tried, then the raw text.
The parse is strict: a missing ``</parameter>`` or ``</function>``, text between parameters, an empty or
repeated name is malformed, never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from polar.tokens.messages import ToolCall, ToolSpec
from polar.tokens.parsers.common import (
    CALL_CLOSE,
    CALL_OPEN,
    arguments_object,
    check_name,
    dump_arguments,
    new_call_id,
    parse_json,
)
from polar.tokens.parsers.format import ToolCallFormat
from polar.tokens.parsers.types import BlockSyntaxError

_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"


def render_tool_call(call: ToolCall) -> str:
    """The block the chat template writes for ``call``; TemplateError if its arguments are not an object."""
    parameters = "".join(
        f"{_PARAMETER_OPEN}{key}>\n{_raw_value(value)}\n{_PARAMETER_CLOSE}\n"
        for key, value in arguments_object(call).items()
    )
    return f"{CALL_OPEN}\n{_FUNCTION_OPEN}{call.name}>\n{parameters}{_FUNCTION_CLOSE}\n{CALL_CLOSE}"


def parse_block(body: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
    """The call in a block body; BlockSyntaxError naming what is wrong."""
    text = body.strip()
    if not text.startswith(_FUNCTION_OPEN):
        raise BlockSyntaxError(f"expected {_FUNCTION_OPEN}NAME> at the start of the block")
    name_end = text.find(">")
    name = text[len(_FUNCTION_OPEN) : name_end].strip() if name_end >= 0 else ""
    if name_end < 0 or any(c == "<" or c.isspace() for c in name):
        raise BlockSyntaxError(f"unterminated or invalid {_FUNCTION_OPEN}NAME> tag")
    check_name(name, tools)
    if not text.endswith(_FUNCTION_CLOSE):
        raise BlockSyntaxError(f"missing {_FUNCTION_CLOSE} at the end of the block")
    types = _parameter_types(tools.get(name))
    arguments = _parse_parameters(text[name_end + 1 : -len(_FUNCTION_CLOSE)], types)
    return ToolCall(name, dump_arguments(arguments), new_call_id())


def _parse_parameters(text: str, types: Mapping[str, set[str]]) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return arguments
        if not text.startswith(_PARAMETER_OPEN, position):
            raise BlockSyntaxError(f"unexpected text in function body: {text[position : position + 40]!r}")
        key_end = text.find(">", position)
        key = text[position + len(_PARAMETER_OPEN) : key_end].strip() if key_end >= 0 else ""
        if not key or "<" in key:
            raise BlockSyntaxError(f"unterminated, empty or invalid {_PARAMETER_OPEN}NAME> tag")
        value_end = text.find(_PARAMETER_CLOSE, key_end)
        if value_end < 0:
            raise BlockSyntaxError(f"parameter {key!r} has no closing {_PARAMETER_CLOSE}")
        if key in arguments:
            raise BlockSyntaxError(f"parameter {key!r} given twice")
        raw = text[key_end + 1 : value_end].removeprefix("\n").removesuffix("\n")
        arguments[key] = _convert(raw, types.get(key, set()))
        position = value_end + len(_PARAMETER_CLOSE)


def _parameter_types(tool: ToolSpec | None) -> dict[str, set[str]]:
    """The declared JSON types of each parameter of ``tool`` (a type list counts as a union)."""
    properties = tool.parameters.get("properties") if tool is not None else None
    if not isinstance(properties, dict):
        return {}
    types: dict[str, set[str]] = {}
    for key, schema in properties.items():
        declared = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(declared, str):
            types[key] = {declared}
        elif isinstance(declared, list):
            types[key] = {t for t in declared if isinstance(t, str)}
    return types


def _convert(raw: str, types: set[str]) -> Any:
    if types == {"string"}:
        return raw
    try:
        value = parse_json(raw)
    except ValueError:
        return raw
    if "string" in types and not types & _json_types(value):
        return raw
    return value


def _json_types(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _raw_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


QWEN3_CODER = ToolCallFormat("qwen3_coder", render_tool_call, parse_block)
