"""The one chat-format protocol every family implements, and the streaming parser built on it.

A ChatFormat renders a conversation to ids, parses sampled ids back to content / reasoning / tool calls, and
extends a previous call's prompt + sampled ids with new messages (our append mode) or says it cannot
(``None``: the caller renders canonically). Parsing never raises on model output: a call that does not parse
is a MalformedToolCall (its text kept in the content), never a made-up call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from polar.tokens.messages import Message, ToolSpec
from polar.tokens.parsers.types import Event, ParsedOutput, ReasoningDelta, TextDelta, ToolCallParsed


@runtime_checkable
class ChatFormat(Protocol):
    family: str

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn."""
        ...

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The canonical prompt ids of a conversation."""
        ...

    def parse(
        self, output_ids: Sequence[int], tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None
    ) -> ParsedOutput:
        """One sampled turn (stop ids included or not) after ``prompt_ids`` (a prefilled channel); never raises."""
        ...

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> list[int] | None:
        """``prompt_ids + output_ids`` (kept verbatim) + the new messages + the generation prompt; ``None`` when
        the format cannot prove that equals a canonical render (the caller then renders canonically)."""
        ...


class ReparseStreamParser:
    """Streaming parse for formats that parse whole id sequences: every ``feed`` re-parses what came so far
    and emits what is new and final (content and reasoning deltas that only grew, tool calls once complete).
    ``finish`` parses the whole turn; the events of a stream fold to exactly ``fmt.parse(all ids)``."""

    def __init__(self, fmt: ChatFormat, tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None):
        self._fmt = fmt
        self._tools = tuple(tools)
        self._prompt = prompt_ids
        self._ids: list[int] = []
        self._content = ""
        self._reasoning = ""
        self._calls = 0

    def _diff(self, parsed: ParsedOutput, final: bool) -> list[Event]:
        events: list[Event] = []
        reasoning = parsed.reasoning or ""
        if reasoning.startswith(self._reasoning) and len(reasoning) > len(self._reasoning):
            events.append(ReasoningDelta(reasoning[len(self._reasoning) :]))
            self._reasoning = reasoning
        # Content is held back while a call may be open (a partial call's text is not content yet), and to the
        # end for formats whose calls are bare JSON in the content (Llama 3): any content may still become a call.
        early = getattr(self._fmt, "calls_delimited", True)
        if (final or (early and not parsed.malformed)) and parsed.content.startswith(self._content):
            if len(parsed.content) > len(self._content):
                events.append(TextDelta(parsed.content[len(self._content) :]))
                self._content = parsed.content
        for index in range(self._calls, len(parsed.tool_calls)):
            events.append(ToolCallParsed(parsed.tool_calls[index], index))
        self._calls = max(self._calls, len(parsed.tool_calls))
        if final:
            events.extend(parsed.malformed)
        return events

    def feed(self, ids: Sequence[int]) -> list[Event]:
        self._ids.extend(ids)
        return self._diff(self._fmt.parse(self._ids, self._tools, self._prompt), final=False)

    def finish(self) -> list[Event]:
        return self._diff(self._fmt.parse(self._ids, self._tools, self._prompt), final=True)
