"""OpenAI Chat Completions (``POST /v1/chat/completions``): Qwen Code, OpenCode (openai-compatible), Pi.

Request: ``system``/``developer`` (→ system), ``user``, ``assistant``, ``tool`` and the legacy ``function``
role (→ tool). Messages keep their order; a system message in the middle of the list stays where it is.
Content is a string, null, or an array of text parts (Qwen Code sends arrays, tool results included);
image parts become a placeholder text (see ``openai_common.IMAGE_PLACEHOLDER``), other part types are
rejected. Tool-call arguments are kept as the string the harness sent. Only ``function`` tools are offered
to the model: other tool types (``custom``, provider-hosted tools) are skipped, because this codec never
emits a call of those kinds, so a harness could not run one.

Response: a ``chat.completion`` object or ``chat.completion.chunk`` SSE frames ending in ``data: [DONE]``.
Token ids and logprobs never reach the harness. Finish reasons: ``tool_calls`` when the reply has calls and
ended naturally, ``length`` when it was cut by the token budget, and also ``length`` for a backend abort (the
reply is cut short; ``stop`` would make the harness treat a truncated reply as final).

Per-request context: ``parse_request`` returns an ``OpenAIChatRequest`` (a ``ChatRequest`` that also
remembers ``stream_options.include_usage``); pass it back as ``request=`` to ``stream_encoder`` so the usage
chunk is sent only when asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Field, Tag

from polar.errors import InvalidRequest, PolarError
from polar.inference import FinishReason
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta, ToolCallParsed
from polar.wire.base import StreamMeta, sse
from polar.wire.body_digest import Repeats
from polar.wire.canonical import ChatRequest, Completion, Usage
from polar.wire.openai_common import (
    Content,
    MaxTokens,
    ModelName,
    ReasoningEffort,
    SamplingWire,
    Text,
    WireModel,
    call_id,
    checked_arguments,
    content_text,
    error_response,
    index_path,
    str_or_list,
    validate,
)
from polar.wire.openai_common import error_object as _error_object
from polar.wire.tool_schema import check_schema

# ---------------------------------------------------------------------------------------------- wire models

Stop = Annotated[Text | Annotated[list[str], Tag("list")], str_or_list("a string or an array of strings")]


class FunctionCallWire(WireModel):
    name: str
    arguments: str  # JSON text; kept verbatim


class ToolCallWire(WireModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallWire


class ChatMessageWire(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    function_call: FunctionCallWire | None = None  # legacy single call on an assistant message
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # vLLM's name for the same thing


class FunctionWire(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolWire(WireModel):
    type: str
    function: FunctionWire | None = None


class StreamOptionsWire(WireModel):
    include_usage: bool | None = None


class ChatBody(SamplingWire):
    model: ModelName
    messages: list[ChatMessageWire] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    functions: list[FunctionWire] | None = None  # legacy form of tools
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: Stop | None = None
    reasoning_effort: ReasoningEffort | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptionsWire | None = None


MAX_STOP = 4  # OpenAI's documented limit on chat's ``stop`` sequences
_TURN_ROLES = frozenset({"user", "assistant", "tool", "function"})  # each a message of its own, never merged


@dataclass(frozen=True)
class OpenAIChatRequest(ChatRequest):
    """A ChatRequest plus what only the Chat wire needs back when answering."""

    include_usage: bool = False


# ------------------------------------------------------------------------------------------------- requests


def _message(wire: ChatMessageWire, path: str) -> Message:
    text = content_text(wire.content, f"{path}.content")
    if wire.role in ("system", "developer"):
        return Message(Role.SYSTEM, text)
    if wire.role == "user":
        return Message(Role.USER, text)
    if wire.role in ("tool", "function"):
        return Message(Role.TOOL, text, tool_call_id=wire.tool_call_id, name=wire.name)
    calls = tuple(
        ToolCall(
            c.function.name, checked_arguments(c.function.arguments, f"{path}.tool_calls[{j}].function.arguments"), c.id
        )
        for j, c in enumerate(wire.tool_calls or ())
    )
    if wire.function_call is not None:
        arguments = checked_arguments(wire.function_call.arguments, f"{path}.function_call.arguments")
        calls += (ToolCall(wire.function_call.name, arguments),)
    reasoning = wire.reasoning_content or wire.reasoning or None
    return Message(Role.ASSISTANT, text, reasoning=reasoning, tool_calls=calls)


def _tools(body: ChatBody) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for index, tool in enumerate(body.tools or ()):
        if tool.type != "function":
            continue  # see the module docstring: only function tools can be called through this wire
        if tool.function is None:
            where = f"{index_path('tools', index)}.function"
            raise InvalidRequest(f"{where}: a function tool needs a function", field=where)
        specs.append(_spec(tool.function, f"{index_path('tools', index)}.function"))
    specs.extend(_spec(function, index_path("functions", index)) for index, function in enumerate(body.functions or ()))
    return tuple(specs)


def _spec(function: FunctionWire, path: str) -> ToolSpec:
    if function.parameters is not None:
        check_schema(function.parameters, f"{path}.parameters")
    return ToolSpec(function.name, function.description or "", function.parameters or {})


# ------------------------------------------------------------------------------------------------ responses


def finish_reason(completion: Completion) -> str:
    if completion.finish_reason is FinishReason.STOP:
        return "tool_calls" if completion.tool_calls else "stop"
    return "length"  # LENGTH, and ABORT: the reply was cut short either way


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def chat_id(completion_id: str) -> str:
    return completion_id if completion_id.startswith("chatcmpl-") else f"chatcmpl-{completion_id}"


def _call_json(call: ToolCall, index: int, completion_id: str, *, delta: bool = False) -> dict[str, Any]:
    # Ids derive from the completion, so the streamed reply and the recorded response() agree.
    out: dict[str, Any] = {"index": index} if delta else {}
    out.update(
        id=call.id or call_id(completion_id, index),
        type="function",
        function={"name": call.name, "arguments": call.arguments},
    )
    return out


class ChatStreamEncoder:
    """``chat.completion.chunk`` frames: a role chunk, deltas as parser events arrive, a finish chunk, an
    optional usage chunk (``choices: []``), then ``[DONE]``.

    Each parsed call goes out whole in one ``tool_calls`` delta (index, id, type, name, full arguments).
    ``finish`` also sends whatever of the completion was not streamed (text, reasoning, calls), so a gateway
    that drives the encoder with ``start`` + ``finish`` alone still produces a complete stream.
    """

    def __init__(self, meta: StreamMeta, *, include_usage: bool):
        self._meta = meta
        self._include_usage = include_usage
        self._text = ""
        self._reasoning = ""
        self._calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse(self._frame([choice]))

    def _frame(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": chat_id(self._meta.completion_id),
            "object": "chat.completion.chunk",
            "created": self._meta.created,
            "model": self._meta.model,
            "choices": choices,
        }

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def on_event(self, event: Event) -> list[str]:
        if isinstance(event, TextDelta) and event.text:
            self._text += event.text
            return [self._chunk({"content": event.text})]
        if isinstance(event, ReasoningDelta) and event.text:
            self._reasoning += event.text
            return [self._chunk({"reasoning_content": event.text})]
        if isinstance(event, ToolCallParsed):
            return [self._call(event.call)]
        return []  # MalformedToolCall: its text already arrived as TextDelta

    def _call(self, call: ToolCall) -> str:
        frame = self._chunk({"tool_calls": [_call_json(call, self._calls, self._meta.completion_id, delta=True)]})
        self._calls += 1
        return frame

    def finish(self, completion: Completion) -> list[str]:
        frames = self._unstreamed(completion)
        frames.append(self._chunk({}, finish_reason(completion)))
        if self._include_usage:
            frames.append(sse({**self._frame([]), "usage": usage_json(completion.usage)}))
        frames.append(sse("[DONE]"))
        return frames

    def _unstreamed(self, completion: Completion) -> list[str]:
        frames: list[str] = []
        reasoning = completion.reasoning or ""
        if len(reasoning) > len(self._reasoning) and reasoning.startswith(self._reasoning):
            frames += self.on_event(ReasoningDelta(reasoning[len(self._reasoning) :]))
        if len(completion.content) > len(self._text) and completion.content.startswith(self._text):
            frames += self.on_event(TextDelta(completion.content[len(self._text) :]))
        frames += [self._call(call) for call in completion.tool_calls[self._calls :]]
        return frames

    def error(self, error: PolarError) -> list[str]:
        # The openai SDKs raise APIError on a chunk that carries "error".
        return [sse({"error": _error_object(error, context_param="messages")}), sse("[DONE]")]


# ---------------------------------------------------------------------------------------------------- codec


class OpenAIChatCodec:
    """The ``openai_chat`` codec. ``response``/``stream_encoder`` take an optional ``request=`` (the parsed
    request) for per-request choices; without it the usage chunk is not sent."""

    name = "openai_chat"
    messages_field = "messages"
    key_in_query = False
    count_tokens_defaults: Mapping[str, Any] = MappingProxyType({})

    def count_tools(self, body: Any) -> int:
        """``function`` tools and legacy ``functions``: every one is rendered."""
        if not isinstance(body, dict):
            return 0
        tools, functions = body.get("tools"), body.get("functions")
        n = (
            sum(1 for t in tools if isinstance(t, dict) and t.get("type") == "function")
            if isinstance(tools, list)
            else 0
        )
        return n + (len(functions) if isinstance(functions, list) else 0)

    def count_messages(self, body: Any) -> int:
        """Messages of a role other than ``system`` and ``developer``: each is one message of its own."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return 0
        try:  # every item an object with a string role (the usual body): read in C, not a Python step a message
            return sum(map(_TURN_ROLES.__contains__, map(dict.get, messages, repeat("role"))))
        except TypeError:  # an item that is no object, or a role that is no string (validation names it)
            roles = (m.get("role") for m in messages if isinstance(m, dict))
            return sum(1 for role in roles if isinstance(role, str) and role in _TURN_ROLES)

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> OpenAIChatRequest:
        return self._request(validate(ChatBody, body))

    def _request(self, wire: ChatBody, offset: int = 0) -> OpenAIChatRequest:
        if wire.n is not None and wire.n != 1:
            raise InvalidRequest("n: only one choice per request is supported (n=1)", field="n")
        if isinstance(wire.stop, list) and len(wire.stop) > MAX_STOP:
            raise InvalidRequest(f"stop: at most {MAX_STOP} stop sequences, not {len(wire.stop)}", field="stop")
        messages = tuple(_message(m, index_path("messages", offset + i)) for i, m in enumerate(wire.messages))
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        return OpenAIChatRequest(
            model=wire.model,
            messages=messages,
            tools=_tools(wire),
            max_tokens=wire.max_completion_tokens or wire.max_tokens,
            sampling=wire.sampling(wire.stop),
            stream=bool(wire.stream),
            include_usage=include_usage,
        )

    def parse_extension(
        self, body: Any, repeats: Repeats, prior: ChatRequest, *, cut: int = 0
    ) -> OpenAIChatRequest | None:
        """``parse_request(body)`` when ``body`` re-sends the messages of the session's previous request (which
        parsed as ``prior``; ``repeats``: what ``body`` repeats of it) and adds some: only the new messages (and the
        tools, when they changed) are validated and converted, so an agent's turn costs what it adds, not its whole
        history. ``cut``: ``body`` was decoded without its first ``cut`` messages (``json_guard.CutBody``). None when
        ``body`` does not extend it, or does not validate (``parse_request`` then names the error)."""
        if not isinstance(body, dict):
            return None
        messages, n = body.get("messages"), len(prior.messages)
        if not isinstance(messages, list) or not 0 < n < len(messages) + cut or repeats.kept("messages") != n:
            return None
        if cut not in (0, n):  # a body cut elsewhere than after the prior's messages is not this one's extension
            return None
        same_tools = all(repeats.same(k) for k in ("tools", "functions"))
        rest = {k: v for k, v in body.items() if not (k == "messages" or (same_tools and k in ("tools", "functions")))}
        rest["messages"] = messages[n - cut :]
        try:
            wire = validate(ChatBody, rest)
            request = self._request(wire, offset=n)
        except InvalidRequest:
            return None
        new = request.messages
        tools = prior.tools if same_tools else request.tools
        return dataclasses.replace(request, messages=(*prior.messages, *new), tools=tools)

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": completion.content or (None if completion.tool_calls else ""),
        }
        if completion.reasoning:
            message["reasoning_content"] = completion.reasoning
        if completion.tool_calls:
            calls = enumerate(completion.tool_calls)
            message["tool_calls"] = [_call_json(call, i, completion.id) for i, call in calls]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(completion)}
        return {
            "id": chat_id(completion.id),
            "object": "chat.completion",
            "created": completion.created,
            "model": completion.model,
            "choices": [choice],
            "usage": usage_json(completion.usage),
        }

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> ChatStreamEncoder:
        include_usage = isinstance(request, OpenAIChatRequest) and request.include_usage
        return ChatStreamEncoder(meta, include_usage=include_usage)

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        return error_response(error, context_param="messages")


CODEC = OpenAIChatCodec()
