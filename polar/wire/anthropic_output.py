"""Anthropic Messages output: Completion -> Message, the Messages SSE stream, and error bodies.

See polar.wire.anthropic for the mapping; this module only encodes."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from polar.errors import ContextLengthExceeded, PolarError
from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta, ToolCallParsed
from polar.wire._wire import arguments_object
from polar.wire.base import StreamMeta, sse
from polar.wire.canonical import Completion, Usage

# --- response --------------------------------------------------------------------------------------------


def _prefixed(prefix: str, raw: str) -> str:
    return raw if raw.startswith(prefix) else prefix + raw


def thinking_signature(text: str) -> str:
    """The signature sent with a thinking block: opaque to clients, and the same for the same text."""
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def _tool_use_id(call: ToolCall, owner_id: str, index: int) -> str:
    if call.id:
        return _prefixed("toolu_", call.id)
    return "toolu_" + hashlib.sha256(f"{owner_id}:{index}".encode()).hexdigest()[:24]


def _tool_use(call: ToolCall, owner_id: str, index: int) -> dict[str, Any]:
    call_id = _tool_use_id(call, owner_id, index)
    return {"type": "tool_use", "id": call_id, "name": call.name, "input": arguments_object(call)}


def stop_reason(completion: Completion) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``.

    Parsed tool calls win over a length stop: each was complete, so the agent can run it. An aborted
    generation has no Anthropic equivalent that clients handle and reads as ``end_turn``.
    """
    if completion.tool_calls:
        return "tool_use", None
    if completion.finish_reason is FinishReason.LENGTH:
        return "max_tokens", None
    if completion.stopped_on_sequence:
        return "stop_sequence", str(completion.matched_stop)
    return "end_turn", None


def _message(
    message_id: str, model: str, content: list[Any], stop: tuple[str | None, str | None], usage: Usage
) -> dict[str, Any]:
    """A Message object; usage reports every prompt token as ``input_tokens`` (no cache accounting)."""
    return {
        "id": _prefixed("msg_", message_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": {
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def message_response(completion: Completion) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if completion.reasoning:
        signature = thinking_signature(completion.reasoning)
        content.append({"type": "thinking", "thinking": completion.reasoning, "signature": signature})
    if completion.content:
        content.append({"type": "text", "text": completion.content})
    content += [_tool_use(call, completion.id, i) for i, call in enumerate(completion.tool_calls)]
    content = content or [{"type": "text", "text": ""}]
    return _message(completion.id, completion.model, content, stop_reason(completion), completion.usage)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(error: PolarError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(error.status_code, "invalid_request_error" if error.status_code < 500 else "api_error")
    message = error.message
    if isinstance(error, ContextLengthExceeded):
        # Claude Code looks for this exact wording to start compacting the conversation.
        message = f"prompt is too long: {error.prompt_tokens} tokens > {error.context_length} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}


def count_tokens_response(n: int) -> dict[str, int]:
    """The body of ``POST /v1/messages/count_tokens``."""
    return {"input_tokens": n}


# --- stream ----------------------------------------------------------------------------------------------


# What a lazily opened block starts as; its deltas fill it in.
_EMPTY_BLOCK = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""}}


def _frame(data: dict[str, Any]) -> str:
    return sse(data, data["type"])


class AnthropicStream:
    """Messages SSE: ``message_start`` (with the real input tokens), ``ping``, the content blocks, then
    ``message_delta`` and ``message_stop``.

    Blocks open lazily as events arrive and the open one is closed before another opens, so interleaved
    reasoning and text become alternating blocks. A thinking block ends with its ``signature_delta``; a
    tool call is a whole block (start, one ``input_json_delta`` with the complete arguments, stop).
    """

    def __init__(self, meta: StreamMeta):
        self._meta = meta
        self._blocks = 0  # blocks opened so far; the next one gets this index
        self._open: str | None = None  # "thinking" or "text" while such a block is open
        self._thinking = ""  # the open thinking block's text, for its signature

    def start(self) -> list[str]:
        meta = self._meta
        message = _message(meta.completion_id, meta.model, [], (None, None), Usage(meta.prompt_tokens, 0))
        return [_frame({"type": "message_start", "message": message}), _frame({"type": "ping"})]

    def on_event(self, event: Event) -> list[str]:
        if isinstance(event, ReasoningDelta) and event.text:
            frames = self._delta("thinking", {"type": "thinking_delta", "thinking": event.text})
            self._thinking += event.text
            return frames
        if isinstance(event, TextDelta) and event.text:
            return self._delta("text", {"type": "text_delta", "text": event.text})
        if isinstance(event, ToolCallParsed):
            block = _tool_use(event.call, self._meta.completion_id, event.index)
            arguments = json.dumps(block["input"], ensure_ascii=False)
            return [
                *self._close(),
                self._open_block({**block, "input": {}}),
                self._block_delta({"type": "input_json_delta", "partial_json": arguments}),
                self._block_stop(),
            ]
        return []  # a MalformedToolCall's text also arrives as a TextDelta

    def finish(self, completion: Completion) -> list[str]:
        frames = self._close()
        if self._blocks == 0:  # the same single empty text block a non-streamed reply would carry
            frames += [self._open_block({"type": "text", "text": ""}), self._block_stop()]
        reason, sequence = stop_reason(completion)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        usage = {"input_tokens": completion.usage.prompt_tokens, "output_tokens": completion.usage.completion_tokens}
        return [
            *frames,
            _frame({"type": "message_delta", "delta": delta, "usage": usage}),
            _frame({"type": "message_stop"}),
        ]

    def error(self, error: PolarError) -> list[str]:
        return [_frame(error_body(error))]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[str]:
        frames: list[str] = []
        if self._open != kind:
            frames += self._close()
            frames.append(self._open_block(_EMPTY_BLOCK[kind]))
            self._open = kind
        return [*frames, self._block_delta(delta)]

    def _open_block(self, block: dict[str, Any]) -> str:
        self._blocks += 1
        return _frame({"type": "content_block_start", "index": self._blocks - 1, "content_block": block})

    def _block_delta(self, delta: dict[str, Any]) -> str:
        return _frame({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta})

    def _block_stop(self) -> str:
        return _frame({"type": "content_block_stop", "index": self._blocks - 1})

    def _close(self) -> list[str]:
        """Close the open thinking or text block, if any (a thinking block first sends its signature)."""
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":
            signature = thinking_signature(self._thinking)
            frames.append(self._block_delta({"type": "signature_delta", "signature": signature}))
            self._thinking = ""
        self._open = None
        return [*frames, self._block_stop()]
