"""Helpers shared by the parser modules: the tags, partial-tag detection, strict JSON and call ids."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from polar.errors import TemplateError
from polar.ids import random_hex
from polar.tokens.messages import ToolCall, ToolSpec
from polar.tokens.parsers.types import BlockSyntaxError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


def partial_tag_length(text: str, *tags: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``.

    That suffix may still grow into the tag, so a streaming parser must hold it back; all text before it can
    be emitted (a complete tag is assumed to have been searched for already).
    """
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str) -> Any:
    """``json.loads`` that rejects NaN/Infinity and reports every failure (even nesting depth) as ValueError."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def dump_arguments(arguments: dict[str, Any]) -> str:
    """The canonical JSON text of parsed arguments (what ``ToolCall.arguments`` holds)."""
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except RecursionError as exc:
        raise BlockSyntaxError("arguments nested too deeply") from exc


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id, ``call_`` and 24 hex digits."""
    return "call_" + random_hex(12)


def tools_by_name(tools: Sequence[ToolSpec] | None) -> dict[str, ToolSpec]:
    return {tool.name: tool for tool in tools or ()}


def check_name(name: str, tools: Mapping[str, ToolSpec]) -> None:
    """Raise BlockSyntaxError for an empty name, or one not declared when tools were declared."""
    if not name.strip():
        raise BlockSyntaxError("empty function name")
    if tools and name not in tools:
        raise BlockSyntaxError(f"unknown function {name!r}; declared: {', '.join(sorted(tools))}")


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """The arguments of a call to render: a JSON object (empty text counts as ``{}``), else TemplateError."""
    if not call.arguments.strip():
        return {}
    try:
        value = parse_json(call.arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TemplateError(
            f"tool call {call.name!r}: arguments must be a JSON object, got {call.arguments[:80]!r}",
            field="tool_calls",
        )
    return value
