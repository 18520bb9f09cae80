"""The assistant reply a stored response JSON carries, as a canonical ``Message``, for each protocol.

The gateway stores ``codec.response(completion)`` beside every capture (streamed or not), so the reply the
harness received can be read back without a tokenizer: text, reasoning and tool calls with their arguments.
Readers are keyed by the protocol name stored in ``captures.protocol``; an unknown protocol or a body of
another shape reads as an empty reply rather than failing (this is for labelling, not for training tokens).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from polar.tokens.messages import Message, Role, ToolCall


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _args(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)


def _openai_chat(body: dict[str, Any]) -> Message:
    choices = _dicts(body.get("choices"))
    message = choices[0].get("message") if choices else None
    if not isinstance(message, dict):
        return Message(Role.ASSISTANT)
    calls = tuple(
        ToolCall(str(fn.get("name", "")), _args(fn.get("arguments")), call.get("id"))
        for call in _dicts(message.get("tool_calls"))
        if isinstance(fn := call.get("function"), dict)
    )
    return Message(Role.ASSISTANT, str(message.get("content") or ""), message.get("reasoning_content"), calls)


def _openai_responses(body: dict[str, Any]) -> Message:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for item in _dicts(body.get("output")):
        kind = item.get("type")
        if kind == "message":
            text += [str(part.get("text", "")) for part in _dicts(item.get("content"))]
        elif kind == "reasoning":
            reasoning += [str(part.get("text", "")) for part in _dicts(item.get("summary"))]
        elif kind == "function_call":
            calls.append(ToolCall(str(item.get("name", "")), _args(item.get("arguments")), item.get("call_id")))
        elif kind == "custom_tool_call":
            calls.append(ToolCall(str(item.get("name", "")), _args({"input": item.get("input")}), item.get("call_id")))
    return Message(Role.ASSISTANT, "".join(text), "".join(reasoning) or None, tuple(calls))


def _anthropic(body: dict[str, Any]) -> Message:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for block in _dicts(body.get("content")):
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            calls.append(ToolCall(str(block.get("name", "")), _args(block.get("input")), block.get("id")))
    return Message(Role.ASSISTANT, "".join(text), "".join(reasoning) or None, tuple(calls))


def _gemini(body: dict[str, Any]) -> Message:
    candidates = _dicts(body.get("candidates"))
    content = candidates[0].get("content") if candidates else None
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for part in _dicts(content.get("parts")) if isinstance(content, dict) else []:
        if isinstance(call := part.get("functionCall"), dict):
            calls.append(ToolCall(str(call.get("name", "")), _args(call.get("args")), call.get("id")))
        elif "text" in part:
            (reasoning if part.get("thought") else text).append(str(part["text"]))
    return Message(Role.ASSISTANT, "".join(text), "".join(reasoning) or None, tuple(calls))


READERS: dict[str, Callable[[dict[str, Any]], Message]] = {
    "openai_chat": _openai_chat,
    "openai_responses": _openai_responses,
    "anthropic_messages": _anthropic,
    "gemini": _gemini,
}


def reply_from_response(protocol: str, body: Any) -> Message:
    """The assistant message in ``body`` (a stored ``captures.response_json``) of ``protocol``."""
    reader = READERS.get(protocol)
    if reader is None or not isinstance(body, dict):
        return Message(Role.ASSISTANT)
    return reader(body)


def _ids_in(value: Any, keys: tuple[str, ...]) -> set[str]:
    """Every string under one of ``keys`` in ``value`` (dicts and lists, walked)."""
    out: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if key in keys and isinstance(inner, str) and inner:
                    out.add(inner)
                elif isinstance(inner, dict | list):
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return out


# Where each protocol's reply names what the gateway minted: the reply's id, its items' and its tool calls'.
_ID_KEYS: dict[str, tuple[str, ...]] = {
    "openai_chat": ("id",),  # chatcmpl-..., choices[].message.tool_calls[].id
    "openai_responses": ("id", "call_id"),  # resp_..., msg_/rs_/fc_ items, call_ids
    "anthropic_messages": ("id",),  # msg_..., tool_use ids
    "gemini": ("responseId", "id"),  # functionCall ids
}


def minted_ids(protocol: str, body: Any) -> frozenset[str]:
    """The ids the gateway minted for the reply stored in ``body`` (``captures.response_json``): the reply's own id
    and its items' and tool calls' ids, exactly as the harness received them. Each is unique to its capture (drawn
    at random per call: ``polar.ids``), and read here from the record, never from a re-parse of the sampled ids, so
    every gateway process and every builder derives the same set. A harness that echoes one of them in a later call
    says which reply it continued (the witness of ``polar.proxy.session.witness``). Empty for an unknown protocol."""
    keys = _ID_KEYS.get(protocol)
    if keys is None or not isinstance(body, dict):
        return frozenset()
    return frozenset(_ids_in(body, keys))
