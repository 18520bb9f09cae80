"""The cost bound of a request, known before any tokenization: how many characters its render tokenizes.

A render tokenizes the text of every message (system prompt, user and assistant text, reasoning, tool calls and
tool results) and every tool definition (name, description and parameter schema, which chat templates write as
JSON, never more compactly than compact JSON). No token covers more characters than the vocabulary's longest
token (``max_token_chars``), so ``chars // max_token_chars`` is a lower bound on the prompt's tokens: a request
whose bound already exceeds the context window is refused (``ContextLengthExceeded``, the provider's own 400)
before any work, never wrongly. Before even that, a body's count
of tool definitions (``ProtocolCodec.count_tools``, no walk) times ``MIN_TOOL_CHARS`` bounds it: 100,000 tools are
refused as soon as the body is decoded. A body's decoded text is never longer than its bytes, so a body of at most
``context_length * max_token_chars`` bytes needs no counting at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from polar.errors import ContextLengthExceeded
from polar.tokens.messages import Message, ToolSpec


def message_chars(messages: Sequence[Message]) -> int:
    """The text of ``messages`` a render tokenizes, in characters (content, reasoning, tool calls)."""
    chars = 0
    for message in messages:
        chars += len(message.content) + len(message.reasoning or "")
        chars += sum(len(call.arguments) + len(call.name) for call in message.tool_calls)
    return chars


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


def surely_too_long(chars: int, max_token_chars: int, context_length: int) -> ContextLengthExceeded | None:
    """The error for a prompt of ``chars`` characters that cannot fit ``context_length`` tokens; None if it may."""
    if max_token_chars <= 0:
        return None
    at_least = chars // max_token_chars
    if at_least <= context_length:
        return None
    error = ContextLengthExceeded(at_least, context_length)
    error.message = f"prompt has at least {at_least} tokens but the model's context window is {context_length} tokens"
    error.args = (error.message,)
    return error
