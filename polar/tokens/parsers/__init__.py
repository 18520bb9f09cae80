"""Model-output parsers: reasoning, content and tool calls, whole or streamed, one registry of formats.

``get_format(name)`` returns a ToolCallFormat: ``parse(text, tools, starts_in_reasoning)`` for a finished
output, ``stream_parser(...)`` for deltas, and ``render_tool_call(call)``, the block writer the chat template
uses, so that rendering and parsing stay inverse in one module per format.
"""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.tokens.parsers.format import ToolCallFormat, collect
from polar.tokens.parsers.hermes import HERMES
from polar.tokens.parsers.qwen3_coder import QWEN3_CODER
from polar.tokens.parsers.stream import StreamParser
from polar.tokens.parsers.types import (
    Event,
    MalformedToolCall,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)

TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {fmt.name: fmt for fmt in (HERMES, QWEN3_CODER)}


def get_format(name: str) -> ToolCallFormat:
    """The tool-call format called ``name``; InvalidRequest naming the known ones otherwise."""
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_CALL_FORMATS))
        raise InvalidRequest(
            f"unknown tool-call format {name!r}; known formats: {known}", field="tool_call_format"
        ) from None


__all__ = [
    "HERMES",
    "QWEN3_CODER",
    "TOOL_CALL_FORMATS",
    "Event",
    "MalformedToolCall",
    "ParsedOutput",
    "ReasoningDelta",
    "StreamParser",
    "TextDelta",
    "ToolCallFormat",
    "ToolCallParsed",
    "collect",
    "get_format",
]
