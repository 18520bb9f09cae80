"""Prompt building: canonical renders and append-mode prompts.

Append mode: when a request extends an earlier call of the same session (its messages, that call's reply
as the harness echoed it, then new messages), the prompt is

    earlier prompt ids + earlier sampled ids (+ end-of-turn if the reply did not end with one)
    + tokens of the newly rendered messages only,

so the model conditions on exactly the ids it sampled and the per-turn cost does not grow with the
conversation. Anything else is rendered canonically (whole conversation, tokenized at once).

With a ``chat_format`` (a polar.chat ChatFormat: any model family) the family renders and extends: its
``extend`` keeps the sampled ids verbatim and adds the new messages, or returns None where it cannot prove that
equals a canonical render (a family that is not prefix-stable there); the call is then rendered canonically and
``fallback_reason`` says why.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from polar.settings import RenderMode
from polar.tokens.lazy_ids import JoinedIds, int32
from polar.tokens.matching import extension_start
from polar.tokens.messages import Message, ToolSpec, shown_tools
from polar.tokens.template import ChatTemplate
from polar.tokens.tokenizer import ChatTokenizer


class FamilyRenderer(Protocol):
    """The rendering half of a polar.chat ChatFormat (this layer does not import polar.chat)."""

    family: str

    @property
    def prefix_stable(self) -> bool:
        """Whether extending a conversation keeps its rendered ids (append mode can equal a canonical render)."""
        ...

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> Sequence[int]: ...

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> Sequence[int] | None: ...


@dataclass(frozen=True)
class PriorCall:
    """An earlier call in the session: what it was asked and the ids it sampled."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    reply: Message  # the reply as parsed from the sampled text
    prompt_ids: Sequence[int]  # the full prompt; may be lazy (len() without materialising it)
    output_ids: Sequence[int]  # as the backend returned them (end-of-turn included when sampled)
    ref: Any = None  # the caller's handle (a capture id)
    minted: frozenset[str] = frozenset()  # the ids its reply went out with (its id, its tool calls')

    @property
    def sequence_length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def sequence_ids(self) -> array[int]:
        """Its prompt then its output, as one int32 array."""
        return int32(self.prompt_ids) + int32(self.output_ids)


@dataclass(frozen=True)
class Prompt:
    """Prompt ids plus their place in the capture tree.

    ``ids == (parent.prompt_ids + parent.output_ids)[:prefix_len] + delta_ids``; a root has no parent and
    ``prefix_len == 0``. ``ids`` is an int32 ``array`` (``int32``: 4 bytes an id, and copying it is one memcpy), or,
    for a prompt that keeps its parent's ids as they are, a ``JoinedIds`` of them and its delta (nothing copied:
    ``int32`` makes it whole); compare with ``list()``.
    """

    ids: Sequence[int]
    mode: RenderMode
    parent: PriorCall | None = None
    prefix_len: int = 0
    fallback_reason: str | None = None  # why append mode did not apply, when it was asked for

    @property
    def delta_ids(self) -> Sequence[int]:
        return self.ids[self.prefix_len :]


class SealedText(Exception):
    """A build met a sealed message (``Message.sealed``): a request decoded on top of the session's history holds
    its earlier messages sealed, and this build would render one of them (no earlier call is extended, or the
    format renders the conversation again). The caller decodes the request whole and plans it again."""


def _texts(messages: Sequence[Message]) -> Sequence[Message]:
    """``messages``, if none is sealed; else ``SealedText`` (a sealed message has no text to render)."""
    if any(message.digest is not None for message in messages):
        raise SealedText()
    return messages


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many ids ``a`` and ``b`` share from their start: compared in C by numpy, not id by id in Python (a
    canonical render of a long session is compared with its parent's ids on every call)."""
    n = min(len(a), len(b))
    x, y = (v if isinstance(v, np.ndarray) else np.frombuffer(int32(v), np.int32) for v in (a, b))
    differ = np.flatnonzero(x[:n] != y[:n])
    return int(differ[0]) if len(differ) else n


def _holds(ids: array[int], part: array[int], at: int) -> bool:
    """Whether ``ids`` holds ``part`` from position ``at`` (read in place: no slice of a long prompt copied)."""
    if at + len(part) > len(ids):
        return False
    return bool(np.array_equal(np.frombuffer(ids, np.int32, len(part), 4 * at), np.frombuffer(part, np.int32)))


class PromptBuilder:
    """Turns canonical messages into prompt ids, reusing earlier calls' ids in append mode."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        template: ChatTemplate | None = None,
        *,
        chat_format: FamilyRenderer | None = None,
    ):
        """``chat_format``: the model family's format; without one, our ChatML template (Qwen3) renders."""
        self.tokenizer = tokenizer
        self.template = template or ChatTemplate()
        self.chat_format = chat_format

    @property
    def tokenizes_only_new_messages(self) -> bool:
        """Whether an append-mode build tokenizes only the messages after its parent's (a family that is not
        prefix-stable may render the whole conversation again instead)."""
        return self.chat_format is None or self.chat_format.prefix_stable

    def canonical_ids(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> array[int]:
        messages = _texts(messages)
        tools = shown_tools(tools)  # a deferred tool's definition is in the message that loaded it
        if self.chat_format is not None:
            return int32(self.chat_format.render_ids(messages, tools))
        return int32(self.tokenizer.encode(self.template.render(messages, tools)))

    def find_parent(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        candidates: Iterable[PriorCall],
        *,
        ordered: bool = False,
    ) -> tuple[PriorCall, int] | None:
        """The deepest earlier call this request extends (the latest one among equals), and where its
        new messages start. Deepest first, so the usual case (the previous turn) costs one comparison.
        ``ordered``: ``candidates`` already come deepest first, latest first among equals (and may be lazy)."""
        if not ordered:
            candidates = sorted(reversed(list(candidates)), key=lambda p: len(p.messages), reverse=True)
        for prior in candidates:
            start = extension_start(messages, tools, prior.messages, prior.tools, prior.reply)
            if start is not None:
                return prior, start
        return None

    def build(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        candidates: Sequence[PriorCall] = (),
        mode: RenderMode = RenderMode.APPEND,
    ) -> Prompt:
        found = self.find_parent(messages, tools, candidates)
        return self.build_on(found, messages, tools, mode, had_candidates=bool(candidates))

    def build_on(
        self,
        found: tuple[PriorCall, int] | None,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        mode: RenderMode = RenderMode.APPEND,
        *,
        had_candidates: bool = True,
    ) -> Prompt:
        """``build`` with the parent already found (``find_parent``)."""
        if found is None:
            reason = "no earlier call is extended by this request" if had_candidates else None
            return Prompt(self.canonical_ids(messages, tools), mode=RenderMode.CANONICAL, fallback_reason=reason)
        parent, start = found
        if mode is RenderMode.CANONICAL:
            # Still a child in the tree; prefix_len says how much of what the model sampled survived.
            ids = self.canonical_ids(messages, tools)
            shared = common_prefix(ids, parent.sequence_ids())
            return Prompt(ids, mode=RenderMode.CANONICAL, parent=parent, prefix_len=shared)
        if self.chat_format is not None:
            return self._extend(self.chat_format, messages, tools, parent, start)
        ids = parent.sequence_ids()  # a new array: extended in place, the parent's ids copied once
        prefix_len = len(ids)
        ids.extend(self.template.following_ids(self.tokenizer, parent.output_ids, _texts(messages[start:])))
        return Prompt(ids, mode=RenderMode.APPEND, parent=parent, prefix_len=prefix_len)

    def _extend(
        self, fmt: FamilyRenderer, messages: Sequence[Message], tools: Sequence[ToolSpec], parent: PriorCall, start: int
    ) -> Prompt:
        prompt_ids, output_ids = parent.prompt_ids, parent.output_ids
        extended = fmt.extend(prompt_ids, output_ids, _texts(messages[start:]), shown_tools(tools))
        if extended is None:
            ids = self.canonical_ids(messages, tools)
            reason = f"the {fmt.family} chat format cannot extend the sampled ids exactly here; rendered canonically"
            shared = common_prefix(ids, parent.sequence_ids())
            return Prompt(ids, mode=RenderMode.CANONICAL, parent=parent, prefix_len=shared, fallback_reason=reason)
        if isinstance(extended, JoinedIds) and extended.starts_with(prompt_ids, output_ids):  # kept as they are
            return Prompt(extended, mode=RenderMode.APPEND, parent=parent, prefix_len=len(extended.head))
        if isinstance(extended, JoinedIds) and extended.head is prompt_ids:  # the prompt kept; the output as the
            # format kept it (closed where the backend cut it, trimmed after its close): say what survived
            kept = common_prefix(extended.tail[: len(output_ids)], output_ids)
            return Prompt(extended, mode=RenderMode.APPEND, parent=parent, prefix_len=len(prompt_ids) + kept)
        # A family may close a turn the backend cut (max tokens) or trim after its close: say what survived.
        ids, prompt, output = int32(extended), int32(prompt_ids), int32(output_ids)
        n, m = len(prompt), len(prompt) + len(output)
        if _holds(ids, prompt, 0) and _holds(ids, output, n):
            return Prompt(ids, mode=RenderMode.APPEND, parent=parent, prefix_len=m)
        return Prompt(ids, mode=RenderMode.APPEND, parent=parent, prefix_len=common_prefix(ids, prompt + output))
