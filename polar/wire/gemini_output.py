"""Gemini output: Completion -> GenerateContentResponse, the ``alt=sse`` stream, and error bodies.

See polar.wire.gemini for the mapping; this module only encodes."""

from __future__ import annotations

from typing import Any

from polar.errors import ContextLengthExceeded, PolarError
from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta, ToolCallParsed
from polar.wire._wire import arguments_object
from polar.wire.base import StreamMeta, sse
from polar.wire.canonical import Completion

# --- response --------------------------------------------------------------------------------------------

_FINISH_REASONS = {FinishReason.STOP: "STOP", FinishReason.LENGTH: "MAX_TOKENS", FinishReason.ABORT: "OTHER"}


def function_call(call: ToolCall) -> dict[str, Any]:
    return {"functionCall": {**({"id": call.id} if call.id else {}), "name": call.name, "args": arguments_object(call)}}


def _chunk(parts: list[dict[str, Any]], response_id: str, model: str, **candidate: Any) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, **candidate, "index": 0}],
        "modelVersion": model,
        "responseId": response_id,
    }


def _usage(completion: Completion) -> dict[str, int]:
    usage = completion.usage
    return {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": usage.completion_tokens,
        "totalTokenCount": usage.total_tokens,
    }


def finish_chunk(completion: Completion, parts: list[dict[str, Any]], response_id: str) -> dict[str, Any]:
    chunk = _chunk(parts, response_id, completion.model, finishReason=_FINISH_REASONS[completion.finish_reason])
    return {**chunk, "usageMetadata": _usage(completion)}


_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(error: PolarError) -> dict[str, Any]:
    code = error.status_code
    status = _STATUSES.get(code, "INVALID_ARGUMENT" if code < 500 else "INTERNAL")
    message = error.message
    if isinstance(error, ContextLengthExceeded):  # Gemini's own wording
        message = (
            f"The input token count ({error.prompt_tokens}) exceeds the maximum number of tokens allowed "
            f"({error.context_length})."
        )
    return {"error": {"code": code, "message": message, "status": status}}


class GeminiStream:
    """``alt=sse`` frames: one GenerateContentResponse per reasoning delta, text delta and parsed call, then
    a last one with ``finishReason`` and ``usageMetadata``. No event names and no ``[DONE]``.
    """

    def __init__(self, meta: StreamMeta):
        self._meta = meta

    def start(self) -> list[str]:
        return []  # Gemini has no opening frame: the first chunk carries the first output

    def on_event(self, event: Event) -> list[str]:
        if isinstance(event, ReasoningDelta) and event.text:
            return [self._frame([{"text": event.text, "thought": True}])]
        if isinstance(event, TextDelta) and event.text:
            return [self._frame([{"text": event.text}])]
        if isinstance(event, ToolCallParsed):
            return [self._frame([function_call(event.call)])]
        return []  # a MalformedToolCall's text also arrives as a TextDelta

    def finish(self, completion: Completion) -> list[str]:
        return [sse(finish_chunk(completion, [], self._meta.completion_id))]

    def error(self, error: PolarError) -> list[str]:
        return [sse(error_body(error))]

    def _frame(self, parts: list[dict[str, Any]]) -> str:
        return sse(_chunk(parts, self._meta.completion_id, self._meta.model))
