"""What the output parsers return: the parsed turn, the streaming events, and the block-parser contract.

A parse never raises on model text. Tool-call text that does not parse is recorded as a `MalformedToolCall`
and also kept, verbatim, in the content, so nothing the model wrote is lost and no call is invented.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polar.tokens.messages import Message, Role, ToolCall, ToolSpec


@dataclass(frozen=True)
class MalformedToolCall:
    """Tool-call text that did not parse (``text`` is the whole block as written) and why.

    Also a streaming event: emitted when the bad block closes, or at ``finish()`` for an unclosed one.
    """

    text: str
    reason: str


@dataclass(frozen=True)
class ParsedOutput:
    """One assistant turn split into content, reasoning (None when the model did not open any) and calls."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedToolCall, ...] = ()

    def message(self) -> Message:
        """The turn as the assistant message a harness echoes back."""
        return Message(Role.ASSISTANT, self.content, self.reasoning, self.tool_calls)


@dataclass(frozen=True)
class ReasoningDelta:
    """More reasoning text."""

    text: str


@dataclass(frozen=True)
class TextDelta:
    """More content text."""

    text: str


@dataclass(frozen=True)
class ToolCallParsed:
    """A complete tool call; ``index`` counts the parsed calls of the turn from 0."""

    call: ToolCall
    index: int


Event = ReasoningDelta | TextDelta | ToolCallParsed | MalformedToolCall


class BlockSyntaxError(ValueError):
    """A tool-call block body that does not parse; the message is the reason recorded for it."""


# A format's block parser: the text between ``<tool_call>`` and ``</tool_call>``, and the declared tools by
# name (empty: names are not checked), to a call with a fresh id; raises BlockSyntaxError, nothing else.
BlockParser = Callable[[str, Mapping[str, ToolSpec]], ToolCall]
