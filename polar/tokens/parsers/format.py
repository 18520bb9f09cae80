"""A tool-call format: how one model family writes calls, bundled with the shared parsing machinery."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from polar.tokens.messages import ToolCall, ToolSpec
from polar.tokens.parsers.stream import StreamParser
from polar.tokens.parsers.types import (
    BlockParser,
    Event,
    MalformedToolCall,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)


@dataclass(frozen=True)
class ToolCallFormat:
    """``render_tool_call`` writes one ``<tool_call>`` block (the chat template uses it); ``parse_block``
    reads one back. ``parse`` and ``stream_parser`` read a whole assistant output (see ``stream.py``)."""

    name: str
    render_tool_call: Callable[[ToolCall], str]
    parse_block: BlockParser

    def stream_parser(self, tools: Sequence[ToolSpec] | None = None, starts_in_reasoning: bool = False) -> StreamParser:
        """A parser for one streamed output; ``tools`` (when given) are the only names accepted."""
        return StreamParser(self.parse_block, tools, starts_in_reasoning)

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, starts_in_reasoning: bool = False
    ) -> ParsedOutput:
        """Parse a whole output; never raises. The same as streaming it in any pieces."""
        parser = self.stream_parser(tools, starts_in_reasoning)
        events = parser.feed(text) + parser.finish()
        return collect(events, reasoning_opened=parser.reasoning_opened)

    def parse_ids(self, tokenizer: Decoder, output_ids: Sequence[int]) -> ParsedOutput:
        """Sampled ids decoded (special tokens dropped) and parsed: the one way a reply's ids become its parts."""
        return self.parse(tokenizer.decode(list(output_ids), skip_special_tokens=True))


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...


def collect(events: Iterable[Event], *, reasoning_opened: bool) -> ParsedOutput:
    """Fold a turn's events into its ParsedOutput."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    malformed: list[MalformedToolCall] = []
    for event in events:
        if isinstance(event, TextDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallParsed):
            calls.append(event.call)
        elif isinstance(event, MalformedToolCall):
            malformed.append(event)
    return ParsedOutput(
        content="".join(content),
        reasoning="".join(reasoning) if reasoning_opened or reasoning else None,
        tool_calls=tuple(calls),
        malformed=tuple(malformed),
    )
