"""OpenAI Responses output: the ``response`` object, its items, and the SSE stream encoder.

The half of the Responses codec that turns a canonical ``Completion`` (or parser events) into the wire;
``openai_responses`` holds the request half and the codec. Item ids derive from the completion id, so the
stream and the ``response()`` recorded for the same completion name the same items and calls.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from polar.errors import InvalidRequest, PolarError
from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta, ToolCallParsed
from polar.wire.base import StreamMeta, sse
from polar.wire.canonical import Completion, Usage
from polar.wire.openai_common import call_id, error_object

REASONING_TOKEN_PREFIX = "polar:"


@dataclass(frozen=True)
class ToolRoute:
    """How an offered tool name maps back to the harness: its kind, its own name, its namespace."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


def encode_reasoning(text: str) -> str:
    """The ``encrypted_content`` we emit: not a secret, an exact round-trip of the reasoning text."""
    return REASONING_TOKEN_PREFIX + base64.b64encode(text.encode()).decode("ascii")


def decode_reasoning(token: str, path: str) -> str | None:
    """Our own token's text; None for another provider's opaque token."""
    if not token.startswith(REASONING_TOKEN_PREFIX):
        return None
    try:
        return base64.b64decode(token[len(REASONING_TOKEN_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidRequest(f"{path}: a corrupted polar reasoning token", field=path) from None


def response_id(completion_id: str) -> str:
    return completion_id if completion_id.startswith("resp_") else f"resp_{completion_id}"


def _item_id(prefix: str, completion_id: str, n: int) -> str:
    # Ids derive from the completion, so a stream and the recorded response() name the same items.
    return f"{prefix}_{completion_id}" if n == 0 else f"{prefix}_{completion_id}_{n}"


def reasoning_item(item_id: str, text: str, *, done: bool = True) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": [], "status": "in_progress"}
    if done:
        item["summary"] = [{"type": "summary_text", "text": text}]
        item["encrypted_content"] = encode_reasoning(text)
        item["status"] = "completed"
    return item


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, *, done: bool = True) -> dict[str, Any]:
    content = [_text_part(text)] if done else []
    status = "completed" if done else "in_progress"
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(
    call: ToolCall, index: int, completion_id: str, routes: Mapping[str, ToolRoute], *, done: bool = True
) -> dict[str, Any]:
    """A ``function_call`` item, or a ``custom_tool_call`` when the tool was declared custom."""
    route = routes.get(call.name, ToolRoute("function", call.name))
    kind = "custom_tool_call" if route.kind == "custom" else "function_call"
    prefix = "ctc" if route.kind == "custom" else "fc"
    item: dict[str, Any] = {
        "type": kind,
        "id": f"{prefix}_{completion_id}_{index}",
        "call_id": call.id or call_id(completion_id, index),
        "name": route.name,
    }
    if route.namespace is not None:
        item["namespace"] = route.namespace
    if route.kind == "custom":
        item["input"] = custom_input(call) if done else ""
    else:
        item["arguments"] = call.arguments if done else ""
        item["status"] = "completed" if done else "in_progress"
    return item


def custom_input(call: ToolCall) -> str:
    """A custom call's text: the ``input`` argument; the raw arguments when the model wrote something else."""
    arguments = call.parsed_arguments()
    text = arguments.get("input") if isinstance(arguments, dict) else None
    if isinstance(text, str):
        return text
    return call.arguments


def output_items(completion: Completion, routes: Mapping[str, ToolRoute]) -> list[dict[str, Any]]:
    cid = completion.id
    items = [reasoning_item(_item_id("rs", cid, 0), completion.reasoning)] if completion.reasoning else []
    if completion.content:
        items.append(message_item(_item_id("msg", cid, 0), completion.content))
    items += [call_item(call, i, cid, routes) for i, call in enumerate(completion.tool_calls)]
    return items


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def response_json(
    completion_id: str,
    created: int,
    model: str,
    output: list[dict[str, Any]],
    completion: Completion | None = None,
    *,
    status: str = "in_progress",
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``response`` object; with a completion, its final status and usage.

    The fields the SDK's ``Response`` model requires are all present (``tools`` is not echoed back).
    """
    incomplete, usage = None, None
    if completion is not None:
        usage = usage_json(completion.usage)
        status = "completed" if completion.finish_reason is FinishReason.STOP else "incomplete"
        if status == "incomplete":  # the token budget or a backend abort cut the reply short
            incomplete = {"reason": "max_output_tokens"}
    return {
        "id": response_id(completion_id),
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "usage": usage,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "previous_response_id": None,
    }


@dataclass
class _OpenItem:
    kind: Literal["reasoning", "message"]
    id: str
    index: int
    text: str = ""


class ResponsesStreamEncoder:
    """Responses SSE: ``response.created``, ``response.in_progress``, then per output item ``added`` → its
    deltas → its ``done`` events → ``response.output_item.done``, and ``response.completed`` (or
    ``response.incomplete``) with the whole response. Every event has ``event:`` and ``sequence_number``.

    Reasoning and text items stay open while their deltas arrive; a call is one item, sent whole.
    ``finish`` also sends whatever of the completion was not streamed, so ``start`` + ``finish`` alone is
    a complete stream. On error: an ``error`` event, then ``response.failed`` whose ``error.code`` is the
    Polar error type (Codex compacts on ``context_length_exceeded``).
    """

    def __init__(self, meta: StreamMeta, routes: Mapping[str, ToolRoute]):
        self._meta = meta
        self._routes = routes
        self._seq = 0
        self._done: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None
        self._opened = {"reasoning": 0, "message": 0}
        self._text = ""
        self._reasoning = ""
        self._calls = 0

    def _event(self, kind: str, **fields: Any) -> str:
        frame = sse({"type": kind, "sequence_number": self._seq, **fields}, event=kind)
        self._seq += 1
        return frame

    def _response(self, completion: Completion | None = None, **kw: Any) -> dict[str, Any]:
        meta = self._meta
        return response_json(meta.completion_id, meta.created, meta.model, list(self._done), completion, **kw)

    def start(self) -> list[str]:
        snapshot = self._response()
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def on_event(self, event: Event) -> list[str]:
        if isinstance(event, TextDelta) and event.text:
            self._text += event.text
            return self._delta("message", event.text)
        if isinstance(event, ReasoningDelta) and event.text:
            self._reasoning += event.text
            return self._delta("reasoning", event.text)
        if isinstance(event, ToolCallParsed):
            return self._close() + self._call(event.call)
        return []  # MalformedToolCall: its text already arrived as TextDelta

    def _delta(self, kind: Literal["reasoning", "message"], text: str) -> list[str]:
        frames = [] if self._open is not None and self._open.kind == kind else self._close() + self._add(kind)
        item = self._open
        assert item is not None
        item.text += text
        where = {"item_id": item.id, "output_index": item.index}
        if kind == "message":
            return frames + [
                self._event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
            ]
        return frames + [self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)]

    def _add(self, kind: Literal["reasoning", "message"]) -> list[str]:
        prefix = "rs" if kind == "reasoning" else "msg"
        item = _OpenItem(kind, _item_id(prefix, self._meta.completion_id, self._opened[kind]), len(self._done))
        self._opened[kind] += 1
        self._open = item
        where = {"item_id": item.id, "output_index": item.index}
        if kind == "message":
            return [
                self._event(
                    "response.output_item.added", output_index=item.index, item=message_item(item.id, "", done=False)
                ),
                self._event("response.content_part.added", **where, content_index=0, part=_text_part("")),
            ]
        return [
            self._event(
                "response.output_item.added", output_index=item.index, item=reasoning_item(item.id, "", done=False)
            ),
            self._event(
                "response.reasoning_summary_part.added",
                **where,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            ),
        ]

    def _close(self) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            done = message_item(item.id, item.text)
            frames = [
                self._event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=_text_part(item.text)),
            ]
        else:
            done = reasoning_item(item.id, item.text)
            part = {"type": "summary_text", "text": item.text}
            frames = [
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=item.text),
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part),
            ]
        self._done.append(done)
        return frames + [self._event("response.output_item.done", output_index=item.index, item=done)]

    def _call(self, call: ToolCall) -> list[str]:
        index, cid = len(self._done), self._meta.completion_id
        added = call_item(call, self._calls, cid, self._routes, done=False)
        done = call_item(call, self._calls, cid, self._routes)
        self._calls += 1
        self._done.append(done)
        where = {"item_id": done["id"], "output_index": index}
        frames = [self._event("response.output_item.added", output_index=index, item=added)]
        if done["type"] == "custom_tool_call":
            frames.append(self._event("response.custom_tool_call_input.delta", **where, delta=done["input"]))
            frames.append(self._event("response.custom_tool_call_input.done", **where, input=done["input"]))
        else:
            arguments = done["arguments"]
            frames.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
            frames.append(
                self._event("response.function_call_arguments.done", **where, name=done["name"], arguments=arguments)
            )
        frames.append(self._event("response.output_item.done", output_index=index, item=done))
        return frames

    def finish(self, completion: Completion) -> list[str]:
        frames: list[str] = []
        reasoning = completion.reasoning or ""
        if len(reasoning) > len(self._reasoning) and reasoning.startswith(self._reasoning):
            frames += self.on_event(ReasoningDelta(reasoning[len(self._reasoning) :]))
        if len(completion.content) > len(self._text) and completion.content.startswith(self._text):
            frames += self.on_event(TextDelta(completion.content[len(self._text) :]))
        for call in completion.tool_calls[self._calls :]:
            frames += self._close() + self._call(call)
        frames += self._close()
        final = self._response(completion)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return frames + [self._event(kind, response=final)]

    def error(self, error: PolarError) -> list[str]:
        body = error_object(error, context_param="input")
        failed = self._response(status="failed", error={"code": body["code"], "message": body["message"]})
        return [
            self._event("error", code=body["code"], message=body["message"], param=body["param"]),
            self._event("response.failed", response=failed),
        ]
