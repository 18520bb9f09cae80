"""The one chat-format protocol every family implements, and the streaming parser built on it.

A ChatFormat renders a conversation to ids, parses sampled ids back to content / reasoning / tool calls (whole,
or streamed through ``stream_parser``), extends a previous call's prompt + sampled ids with new messages (our
append mode) or says it cannot (``None``: the caller renders canonically), and writes the ids a model of the
family samples for a given assistant turn (``reply_ids``: scripted policies). Parsing never raises on model
output: a call that does not parse is a MalformedToolCall (its text kept in the content), never a made-up call.

The gateway serves every family through this protocol alone: core code never asks which family it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from polar.tokens.messages import Message, ToolSpec
from polar.tokens.parsers.types import Event, ParsedOutput, ReasoningDelta, TextDelta, ToolCallParsed


class OutputStream(Protocol):
    """One streamed turn: sampled ids in, parse events out; the events of ``feed``s and ``finish`` fold (with
    ``reasoning_opened``) to the format's ``parse`` of all the ids."""

    @property
    def reasoning_opened(self) -> bool: ...

    def feed(self, ids: Sequence[int]) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


@runtime_checkable
class ChatFormat(Protocol):
    family: str

    @property
    def prefix_stable(self) -> bool:
        """Whether extending a conversation keeps its rendered ids (append mode can equal a canonical render)."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn."""
        ...

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> Sequence[int]:
        """The canonical prompt ids of a conversation (a list, or an int32 array: compare with ``list(...)``)."""
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
    ) -> Sequence[int] | None:
        """``prompt_ids + output_ids`` (kept verbatim) + the new messages + the generation prompt; ``None`` when
        the format cannot prove that equals a canonical render (the caller then renders canonically). A list, an
        int32 ``array``, or a ``polar.tokens.lazy_ids.JoinedIds`` that keeps the earlier ids as they are, neither
        copied nor read: of ``JoinedIds(prompt_ids, output_ids)`` (those very objects) and the new ids, or of
        ``prompt_ids`` and the output as the format kept it (closed, or trimmed after its close) then the new ids."""
        ...

    def stream_parser(self, tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None) -> OutputStream:
        """A parser for one streamed turn sampled after ``prompt_ids``."""
        ...

    def reply_ids(self, message: Message) -> list[int]:
        """The ids a model of this family samples for the assistant turn ``message`` (its stop id last)."""
        ...


class ReparseStreamParser:
    """Streaming parse for formats that parse whole id sequences: every ``feed`` re-parses what came so far
    and emits what is new and final (content and reasoning deltas that only grew, tool calls once complete).
    ``finish`` parses the whole turn; the events of a stream fold to exactly ``fmt.parse(all ids)``.

    A re-parse waits until the ids not yet parsed are at least 1/``batch`` of those so far, so a turn of n ids
    costs O(batch·n) parsing, not O(n²) (a delta is then at most that far behind the sampled ids)."""

    batch = 32

    def __init__(self, fmt: ChatFormat, tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None):
        self._fmt = fmt
        self._tools = tuple(tools)
        self._prompt = list(prompt_ids) if prompt_ids is not None else None  # once, not per feed
        self._ids: list[int] = []
        self._content = ""
        self._reasoning = ""
        self._calls = 0
        self._opened = False
        self._parsed = 0  # ids seen by the last re-parse

    @property
    def reasoning_opened(self) -> bool:
        return self._opened

    def _diff(self, parsed: ParsedOutput, final: bool) -> list[Event]:
        events: list[Event] = []
        self._opened = self._opened or parsed.reasoning is not None
        # A re-parse that ends inside a character (its UTF-8 bytes split over two ids) decodes it as U+FFFD: hold
        # it back until the next ids complete it, or the text sent would stop being a prefix of the text parsed.
        reasoning, content = parsed.reasoning or "", parsed.content
        if not final:
            reasoning, content = reasoning.rstrip("\ufffd"), content.rstrip("\ufffd")
        if reasoning.startswith(self._reasoning) and len(reasoning) > len(self._reasoning):
            events.append(ReasoningDelta(reasoning[len(self._reasoning) :]))
            self._reasoning = reasoning
        # Content is held back while a call may be open (a partial call's text is not content yet), and to the
        # end for formats whose calls are bare JSON in the content (Llama 3): any content may still become a call.
        early = getattr(self._fmt, "calls_delimited", True)
        if (final or (early and not parsed.malformed)) and content.startswith(self._content):
            if len(content) > len(self._content):
                events.append(TextDelta(content[len(self._content) :]))
                self._content = content
        for index in range(self._calls, len(parsed.tool_calls)):
            events.append(ToolCallParsed(parsed.tool_calls[index], index))
        self._calls = max(self._calls, len(parsed.tool_calls))
        if final:
            events.extend(parsed.malformed)
        return events

    def feed(self, ids: Sequence[int]) -> list[Event]:
        self._ids.extend(ids)
        if len(self._ids) - self._parsed < max(1, len(self._ids) // self.batch):
            return []
        self._parsed = len(self._ids)
        return self._diff(self._fmt.parse(self._ids, self._tools, self._prompt), final=False)

    def finish(self) -> list[Event]:
        return self._diff(self._fmt.parse(self._ids, self._tools, self._prompt), final=True)
