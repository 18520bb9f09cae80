"""The incremental parser shared by every tool-call format: reasoning, content text and ``<tool_call>`` blocks.

After the reasoning (see ``reasoning.py``) the output is read as text and blocks
``<tool_call>BODY</tool_call>``; the format's block parser turns a BODY into a call. The rules, identical
whether the output arrives whole or in any pieces:

- A block that does not parse, one still open at the end, and a stray ``</tool_call>`` are text: they stay in
  the content verbatim and are reported as ``MalformedToolCall``.
- The content is the text before the first parsed call, less the one "\\n" the template puts before a block,
  then each later stretch of text between or after parsed calls that is not all whitespace, verbatim (less
  that one "\\n" when a parsed call follows it).

Text is emitted as soon as it is known to be content. Held back are only: a suffix that could still become
a tag; a block until it closes (it may yet fail to parse and turn into text); one trailing "\\n" (a parsed
call may follow it); and, after a parsed call, whitespace until something else arrives (all-whitespace
stretches between calls are the template's separators, not content).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polar.tokens.messages import ToolSpec
from polar.tokens.parsers.common import CALL_CLOSE, CALL_OPEN, partial_tag_length, tools_by_name
from polar.tokens.parsers.reasoning import ReasoningSplitter
from polar.tokens.parsers.types import (
    BlockParser,
    BlockSyntaxError,
    Event,
    MalformedToolCall,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)


class _TextRun:
    """The content text between two parsed calls, released as soon as it is known to be content."""

    def __init__(self) -> None:
        self._held = ""
        self._after_call = False  # this stretch follows a parsed call
        self._visible = False  # ... and has something other than whitespace

    def text(self, text: str) -> list[Event]:
        if not text:
            return []
        self._held += text
        if self._after_call and not self._visible:
            if text.isspace():
                return []
            self._visible = True
        released, self._held = (self._held[:-1], "\n") if self._held.endswith("\n") else (self._held, "")
        return [TextDelta(released)] if released else []

    def end_with_call(self) -> None:
        """A parsed call follows: what is held (a separator "\\n" or all-whitespace stretch) is not content."""
        self._held, self._after_call, self._visible = "", True, False

    def finish(self) -> list[Event]:
        held, self._held = self._held, ""
        if self._after_call and not self._visible:
            return []
        return [TextDelta(held)] if held else []


class ToolCallSplitter:
    """Feed content text (the output after the reasoning); get text deltas, parsed calls and malformed blocks."""

    def __init__(self, parse_block: BlockParser, tools: Mapping[str, ToolSpec]):
        self._parse_block = parse_block
        self._tools = tools
        self._buffer = ""
        self._in_block = False
        self._searched = 0  # inside a block: where to resume the search for </tool_call>
        self._run = _TextRun()
        self._calls = 0

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if self._in_block:
                end = self._buffer.find(CALL_CLOSE, self._searched)
                if end < 0:
                    self._searched = max(0, len(self._buffer) - len(CALL_CLOSE) + 1)
                    return events
                events += self._close_block(self._buffer[:end])
                self._buffer = self._buffer[end + len(CALL_CLOSE) :]
                self._in_block, self._searched = False, 0
                continue
            opening, closing = self._buffer.find(CALL_OPEN), self._buffer.find(CALL_CLOSE)
            if opening < 0 and closing < 0:
                cut = len(self._buffer) - partial_tag_length(self._buffer, CALL_OPEN, CALL_CLOSE)
                events += self._run.text(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                return events
            if closing >= 0 and (opening < 0 or closing < opening):
                events += self._run.text(self._buffer[:closing])
                events.append(MalformedToolCall(CALL_CLOSE, "stray </tool_call> without an opening <tool_call>"))
                events += self._run.text(CALL_CLOSE)
                self._buffer = self._buffer[closing + len(CALL_CLOSE) :]
            else:
                events += self._run.text(self._buffer[:opening])
                self._buffer = self._buffer[opening + len(CALL_OPEN) :]
                self._in_block = True

    def finish(self) -> list[Event]:
        """Flush the held text; a block still open is malformed and becomes text."""
        rest, self._buffer = self._buffer, ""
        events: list[Event] = []
        if self._in_block:
            rest = CALL_OPEN + rest
            events.append(MalformedToolCall(rest, "unclosed <tool_call> at end of output"))
            self._in_block = False
        return events + self._run.text(rest) + self._run.finish()

    def _close_block(self, body: str) -> list[Event]:
        try:
            call = self._parse_block(body, self._tools)
        except BlockSyntaxError as exc:
            raw = CALL_OPEN + body + CALL_CLOSE
            return [MalformedToolCall(raw, str(exc)), *self._run.text(raw)]
        self._run.end_with_call()
        self._calls += 1
        return [ToolCallParsed(call, self._calls - 1)]


class StreamParser:
    """Incremental parse of one assistant output: ``feed`` each text delta, then ``finish`` once.

    For any split of a text into deltas the events add up to ``parse`` of the whole text: the TextDelta texts
    concatenate to its content, the ReasoningDelta texts to its reasoning, and the calls and malformed blocks
    come in the same order (call ids are fresh on every parse).
    """

    def __init__(
        self,
        parse_block: BlockParser,
        tools: Sequence[ToolSpec] | None = None,
        starts_in_reasoning: bool = False,
    ):
        self._reasoning = ReasoningSplitter(starts_in_reasoning)
        self._content = ToolCallSplitter(parse_block, tools_by_name(tools))
        self._finished = False

    @property
    def reasoning_opened(self) -> bool:
        """Whether the output (or the prompt) opened reasoning, so that the reasoning is "" rather than None."""
        return self._reasoning.opened

    def feed(self, delta: str) -> list[Event]:
        if self._finished:
            raise ValueError("StreamParser.feed() after finish()")
        reasoning, content = self._reasoning.feed(delta)
        head: list[Event] = [ReasoningDelta(reasoning)] if reasoning else []
        return head + self._content.feed(content)

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        self._finished = True
        reasoning, content = self._reasoning.finish()
        head: list[Event] = [ReasoningDelta(reasoning)] if reasoning else []
        return head + self._content.feed(content) + self._content.finish()
