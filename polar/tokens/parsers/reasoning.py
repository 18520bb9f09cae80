"""Incremental split of a model output into reasoning and the rest (the content, tool calls included).

The contract, identical whether the output arrives whole or in any pieces:

- ``<think>`` at the start of the output (after optional whitespace, which is dropped) opens reasoning. With
  ``starts_in_reasoning`` the prompt already opened it: the output is read as if it began with ``<think>``.
- The reasoning is the text up to ``</think>`` less ONE leading and ONE trailing "\\n" (the template writes
  ``"<think>\\n" + reasoning + "\\n</think>\\n\\n"``); the content is the text after ``</think>`` less up to
  two leading "\\n". If ``</think>`` never comes (truncated output), the reasoning runs to the end (less one
  leading "\\n") and the content is "".
- Without an opening ``<think>`` the whole output is content. ``<think>``/``</think>`` anywhere else is text.

Only what could still turn into a tag (or a newline the template may have put before ``</think>``) is held.
"""

from __future__ import annotations

from enum import Enum

from polar.tokens.parsers.common import THINK_CLOSE, THINK_OPEN, partial_tag_length


class _Phase(Enum):
    START = "start"  # whitespace and a possible beginning of <think> so far
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningSplitter:
    """Feed output text; get back ``(reasoning, content)`` text that is final (reasoning always comes first)."""

    def __init__(self, starts_in_reasoning: bool = False):
        self._phase = _Phase.REASONING if starts_in_reasoning else _Phase.START
        self._buffer = ""
        self._at_reasoning_start = True  # the one leading "\n" of reasoning is still to be dropped
        self._newlines_to_drop = 0  # after </think>: up to two
        self.opened = starts_in_reasoning  # whether reasoning was opened (reasoning "" is not None)

    def feed(self, delta: str) -> tuple[str, str]:
        self._buffer += delta
        reasoning = ""
        if self._phase is _Phase.START:
            head = self._buffer.lstrip()
            if head.startswith(THINK_OPEN):
                self._buffer = head[len(THINK_OPEN) :]
                self._phase, self.opened = _Phase.REASONING, True
            elif THINK_OPEN.startswith(head):
                return "", ""
            else:
                self._phase = _Phase.CONTENT
        if self._phase is _Phase.REASONING:
            self._drop_leading_newline()
            end = self._buffer.find(THINK_CLOSE)
            if end < 0:
                keep = partial_tag_length(self._buffer, "\n" + THINK_CLOSE, THINK_CLOSE)
                cut = len(self._buffer) - keep
                reasoning, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return reasoning, ""
            reasoning = self._buffer[:end].removesuffix("\n")
            self._buffer = self._buffer[end + len(THINK_CLOSE) :]
            self._phase, self._newlines_to_drop = _Phase.CONTENT, 2
        while self._newlines_to_drop and self._buffer:
            if not self._buffer.startswith("\n"):
                self._newlines_to_drop = 0
                break
            self._buffer = self._buffer[1:]
            self._newlines_to_drop -= 1
        content, self._buffer = self._buffer, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Flush what was held: a possible ``<think>`` prefix is content; unclosed reasoning is reasoning."""
        rest, self._buffer = self._buffer, ""
        if self._phase is _Phase.REASONING:
            if self._at_reasoning_start:
                rest = rest.removeprefix("\n")
            return rest, ""
        return "", rest

    def _drop_leading_newline(self) -> None:
        if self._at_reasoning_start and self._buffer:
            self._buffer = self._buffer.removeprefix("\n")
            self._at_reasoning_start = False
