"""The cost bound of a request, known before any tokenization: how many characters its render tokenizes.

A render tokenizes the text of every message (system prompt, user and assistant text, reasoning, tool calls and
tool results) and every tool definition (name, description and parameter schema, which chat templates write as
JSON, never more compactly than compact JSON). No token covers more characters than the vocabulary's longest
token (``max_token_chars``), so ``chars // max_token_chars`` is a lower bound on the prompt's tokens: a request
whose bound already exceeds the context window is refused (``ContextLengthExceeded``, the provider's own 400)
before any work, never wrongly.

Text is not all a render writes: every message costs the chat template's markers (``<|im_start|>``, ``<|im_end|>``,
``<tool_response>``...), added tokens that the tokenizer matches before anything else, so each is one token
whatever text surrounds it. ``message_tokens`` measures the fewest a message adds, once per gateway; a body of
200,000 one-character messages then needs at least 400,000 tokens, whatever its text.

The bound is applied first to the body's SHAPE (``CostBound.refuse_shape``), on the decoded JSON before it is
checked, validated or converted: its count of tool definitions (``ProtocolCodec.count_tools``) times
``MIN_TOOL_CHARS``, and its count of messages (``ProtocolCodec.count_messages``) times ``message_tokens``. A body
refused so costs no per-message work at all (no conversion, sealing, rendering or tokenizing): 100,000 tools or
800,000 messages are refused as soon as the body is decoded. Then to its text (``CostBound.refuse``). A body's
decoded text is never longer than its bytes, so only a body of more than ``context_length * max_token_chars`` bytes
(``CostBound.bound_bytes``) can be refused for its text alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from polar.errors import ContextLengthExceeded
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, assistant, system, tool_result, user
from polar.tokens.render import PromptBuilder
from polar.tokens.tokenizer import ChatTokenizer
from polar.wire.base import ProtocolCodec

INLINE_CHARS = 16_384  # a build tokenizing up to this much text runs on the event loop (about 1 ms at most)


def message_chars(messages: Sequence[Message]) -> int:
    """The text of ``messages`` a render tokenizes, in characters (content, reasoning, tool calls)."""
    chars = 0
    for message in messages:
        chars += len(message.content) + len(message.reasoning or "")
        chars += sum(len(call.arguments) + len(call.name) for call in message.tool_calls)
    return chars


def counted_messages(messages: Sequence[Message]) -> int:
    """How many of ``messages`` the bound charges the template's per-message tokens for: all but system messages
    (``message_tokens``)."""
    return sum(1 for message in messages if message.role is not Role.SYSTEM)


def tool_chars(tools: Sequence[ToolSpec]) -> int:
    """The text of ``tools`` a render tokenizes, at least: names, descriptions and schemas as compact JSON."""
    chars = 0
    for tool in tools:
        chars += len(tool.name) + len(tool.description)
        try:
            schema = orjson.dumps(tool.parameters)
        except TypeError:  # not JSON orjson writes; its text is not counted (a lower bound stays one)
            continue
        chars += len(schema) if schema.isascii() else len(schema.decode())
    return chars


MIN_TOOL_CHARS = len(orjson.dumps(ToolSpec("").as_json()))
"""The fewest characters a render writes for one tool definition: chat templates write each as its JSON
(``ToolSpec.as_json``), never more compactly than compact JSON with an empty name, description and schema."""


@dataclass(frozen=True)
class CostBound:
    """The cost bound's numbers: the vocabulary's longest token in characters (0: no bound), the context window,
    and the fewest tokens the chat template writes for one message besides its text (``message_tokens``)."""

    max_token_chars: int
    context_length: int
    message_tokens: int = 0

    def surely_too_long(self, chars: int, messages: int = 0, field: str = "messages") -> ContextLengthExceeded | None:
        """The error for a prompt of ``chars`` characters of text in ``messages`` messages (``counted_messages``)
        that cannot fit the context window; None if it may. The last message is not charged (an assistant prefill
        may be left open). The error names ``field`` (the body's conversation) when its messages alone do not fit."""
        if self.max_token_chars <= 0:
            return None
        charged = max(messages - 1, 0) * self.message_tokens
        at_least = chars // self.max_token_chars + charged
        if at_least <= self.context_length:
            return None
        error = ContextLengthExceeded(at_least, self.context_length)
        error.message = (
            f"prompt has at least {at_least} tokens but the model's context window is {self.context_length} tokens"
        )
        error.args = (error.message,)
        if charged > self.context_length:
            error.field = field
        return error

    def refuse(self, chars: int, messages: int = 0, field: str = "messages") -> None:
        """Raises ``surely_too_long``'s error, if any."""
        error = self.surely_too_long(chars, messages, field)
        if error is not None:
            raise error

    def refuse_shape(self, codec: ProtocolCodec, body: Any, earlier: int = 0) -> int:
        """The bound from ``body``'s shape alone (decoded JSON, not yet checked or validated): its tool definitions
        and its messages counted, their text not read. Cheap (no conversion); before any per-message work.
        ``earlier``: the count of messages the body holds but were not decoded (``json_guard.CutBody``). Returns
        the messages counted, those included."""
        messages = codec.count_messages(body) + earlier
        self.refuse(codec.count_tools(body) * MIN_TOOL_CHARS, messages, codec.messages_field)
        return messages

    def bound_bytes(self) -> int:
        """A body of at most this many bytes cannot be refused for its text alone (its decoded text is no longer
        than its bytes); 0 when there is no bound."""
        return self.context_length * self.max_token_chars if self.max_token_chars > 0 else 0


def marker_ids(tokenizer: ChatTokenizer) -> frozenset[int]:
    """The tokenizer's added tokens that are surely one token wherever a render writes them: the tokenizer matches
    added tokens before it splits the rest, so one whose text overlaps no other added token's (neither contains
    the other, nor ends as the other starts) can neither be absorbed by neighbouring text nor straddle it."""
    added = tokenizer.added_tokens()
    texts = set(added.values())
    return frozenset(i for i, text in added.items() if not any(_overlap(text, o) for o in texts if o != text))


def _overlap(a: str, b: str) -> bool:
    if a in b or b in a:
        return True
    return any(a.endswith(b[:n]) or b.endswith(a[:n]) for n in range(1, min(len(a), len(b))))


def message_tokens(builder: PromptBuilder) -> int:
    """The fewest marker tokens (``marker_ids``) a render adds for one more message, over user, assistant and tool
    messages, each after one of its own role (where a template may merge them: consecutive tool results in one
    turn) and after two; 0 when a render fails or a message adds none (then messages add nothing to the bound).
    System messages are never counted (a template may fold them into one), nor is a body's last message (an
    assistant prefill may be left open)."""
    markers = marker_ids(builder.tokenizer)
    call = ToolCall("f", "{}", "c")
    opening = [system("s"), user("u"), assistant(tool_calls=(call,))]
    roles = (user("u"), assistant("a"), tool_result("r", "c"))
    fewest: int | None = None
    try:
        for message in roles:
            counts = [_marked(builder, [*opening, *[message] * n], markers) for n in (1, 2, 3)]
            for added in (counts[1] - counts[0], counts[2] - counts[1]):
                fewest = added if fewest is None else min(fewest, added)
    except Exception:  # noqa: BLE001 -- a template that refuses such a conversation: no bound from messages
        return 0
    return max(fewest or 0, 0)


def _marked(builder: PromptBuilder, messages: list[Message], markers: frozenset[int]) -> int:
    return sum(1 for i in builder.canonical_ids(messages, ()) if i in markers)
