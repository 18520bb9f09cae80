"""Hermes / Qwen2.5 tool calls (SGLang ``qwen25``, vLLM ``hermes``): one JSON object per block.

A block is ``"<tool_call>\\n" + json.dumps({"name": NAME, "arguments": ARGS}, ensure_ascii=False) +
"\\n</tool_call>"``. Parsing accepts any JSON spacing (models write it compact) and re-serialises the
arguments as ``json.dumps(ARGS, ensure_ascii=False)``, as SGLang does. A missing ``"arguments"`` means ``{}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

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

_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


def render_tool_call(call: ToolCall) -> str:
    """The block the chat template writes for ``call``; TemplateError if its arguments are not an object."""
    payload = {"name": call.name, "arguments": arguments_object(call)}
    return f"{CALL_OPEN}\n{json.dumps(payload, ensure_ascii=False)}\n{CALL_CLOSE}"


def parse_block(body: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
    """The call in a block body; BlockSyntaxError naming what is wrong."""
    try:
        payload = parse_json(body)
    except ValueError as exc:
        raise BlockSyntaxError(f"invalid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BlockSyntaxError(f"tool call is a JSON {_json_type(payload)}, not an object")
    name = payload.get("name")
    if not isinstance(name, str):
        raise BlockSyntaxError('missing "name"' if name is None else f'"name" is a JSON {_json_type(name)}')
    check_name(name, tools)
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        raise BlockSyntaxError(f'"arguments" is a JSON {_json_type(arguments)}, not an object')
    return ToolCall(name, dump_arguments(arguments), new_call_id())


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), "null")


HERMES = ToolCallFormat("hermes", render_tool_call, parse_block)
