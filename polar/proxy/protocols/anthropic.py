"""Anthropic Messages (``POST /v1/messages``, with or without ``?beta=true``): Claude Code, OpenCode, Pi.

Request -> ChatRequest. Unknown fields are ignored; wrong types and missing required fields (``model``,
``messages``, ``max_tokens``, as the official API requires) are an InvalidRequest naming the JSON path.
- ``system`` (a string or text blocks, joined with "\\n") becomes a leading system message, less Claude
  Code's ``x-anthropic-billing-header: ...`` line: it changes on every request and would break prefix reuse.
  ``role: "system"`` messages inside ``messages`` (Claude Code's mid-conversation system beta) stay in place.
- A user message becomes one ``tool`` message per ``tool_result`` block (``tool_call_id`` = ``tool_use_id``,
  text blocks joined with "\\n", ``is_error`` marked by an ``"Error: "`` prefix because the canonical
  message has no error flag), then one user message with its text blocks (Claude Code puts
  ``<system-reminder>`` text next to results), joined with "\\n".
- An assistant message: text blocks -> content ("\\n"-joined), ``thinking`` -> reasoning (the client's
  signature is ignored), ``redacted_thinking`` is skipped, ``tool_use`` -> ToolCall with
  ``json.dumps(input)`` as its arguments.
- Image, document and search-result blocks (Claude Code's Read returns images and PDFs as tool results)
  become a placeholder text, ``[image omitted: this model cannot see images]``, rather than a 400: the
  model reads text only, and a 400 would end the agent's loop. The OpenAI codecs do the same.
- Custom tools (``input_schema``) become ToolSpecs; server tools (a ``type`` such as
  ``web_search_20250305`` and no schema) run on Anthropic's side and are skipped.
- ``temperature``, ``top_p``, ``top_k`` and ``stop_sequences`` (as ``stop``) go to ``sampling``;
  ``cache_control``, ``metadata``, ``thinking``, ``context_management``, ``output_config``, ``tool_choice``
  and ``service_tier`` are ignored.

Completion -> Message: a thinking block (its signature is base64(sha256(text)): deterministic, opaque),
a text block, one ``tool_use`` block per call (ids ``toolu_``-prefixed), or one empty text block when
the model produced nothing. Usage reports every prompt token as ``input_tokens``; no cache accounting.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.backends.base import FinishReason
from polar.errors import ContextLengthExceeded, InvalidRequest, PolarError
from polar.proxy.canonical import ChatRequest, Completion, Usage
from polar.proxy.protocols._wire import arguments_object, media_placeholder, not_none, parse_body
from polar.proxy.protocols.base import StreamMeta, sse
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta, ToolCallParsed

BILLING_HEADER = "x-anthropic-billing-header:"
TOOL_ERROR_PREFIX = "Error: "


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Text(_Wire):
    type: Literal["text"]
    text: str


class _Thinking(_Wire):
    type: Literal["thinking"]
    thinking: str


class _RedactedThinking(_Wire):
    type: Literal["redacted_thinking"]


class _ToolUse(_Wire):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class _Media(_Wire):
    """Blocks the model cannot read: each becomes a placeholder text."""

    type: Literal["image", "document", "search_result"]

    @property
    def placeholder(self) -> str:
        return media_placeholder(self.type)


_ResultPart = Annotated[_Text | _Media, Field(discriminator="type")]


class _ToolResult(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[_ResultPart] = ""
    is_error: bool = False


_Block = Annotated[_Text | _Thinking | _RedactedThinking | _ToolUse | _ToolResult | _Media, Field(discriminator="type")]


class _Message(_Wire):
    role: Literal["user", "assistant", "system"]
    content: str | list[_Block]


class _Tool(_Wire):
    name: str
    type: str | None = None  # absent or "custom" for client tools; a versioned name for server tools
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _Request(_Wire):
    # Scalars first: errors are reported in field order, and a wrong max_tokens is easier to act on than a
    # problem deep inside the conversation.
    model: str
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    system: str | list[_Text] | None = None
    tools: list[_Tool] | None = None
    messages: list[_Message] = Field(min_length=1)


# --- request ---------------------------------------------------------------------------------------------


def _misplaced(block: BaseModel, path: str, role: str) -> InvalidRequest:
    kind = getattr(block, "type", "?")
    return InvalidRequest(f"{path}: {kind} blocks are not allowed in {role} content", field=path)


def _system_text(system: str | list[_Text]) -> str:
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    kept = ("\n".join(line for line in text.split("\n") if not line.startswith(BILLING_HEADER)) for text in texts)
    return "\n".join(text for text in kept if text)


def _plain_text(content: str | list[Any], path: str, role: str) -> str:
    """Content that holds text only (system messages, tool results), "\\n"-joined; media as placeholders."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        if isinstance(block, _Text):
            texts.append(block.text)
        elif isinstance(block, _Media) and role != "system":
            texts.append(block.placeholder)
        else:
            raise _misplaced(block, f"{path}[{j}].type", role)
    return "\n".join(texts)


def _user(content: str | list[Any], path: str) -> list[Message]:
    if isinstance(content, str):
        return [Message(Role.USER, content)]
    results: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        if isinstance(block, _Text):
            texts.append(block.text)
        elif isinstance(block, _Media):
            texts.append(block.placeholder)
        elif isinstance(block, _ToolResult):
            text = _plain_text(block.content, f"{path}[{j}].content", "tool_result")
            text = TOOL_ERROR_PREFIX + text if block.is_error else text
            results.append(Message(Role.TOOL, text, tool_call_id=block.tool_use_id))
        else:
            raise _misplaced(block, f"{path}[{j}].type", "user")
    # Results answer the previous assistant turn, so they come first; an all-results message adds no user turn.
    return results + ([Message(Role.USER, "\n".join(texts))] if texts or not results else [])


def _assistant(content: str | list[Any], path: str) -> Message:
    if isinstance(content, str):
        return Message(Role.ASSISTANT, content)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(content):
        if isinstance(block, _Text):
            texts.append(block.text)
        elif isinstance(block, _Thinking):
            thoughts.append(block.thinking)
        elif isinstance(block, _ToolUse):
            calls.append(ToolCall(block.name, json.dumps(block.input, ensure_ascii=False), id=block.id))
        elif not isinstance(block, _RedactedThinking):  # encrypted reasoning from another model: unusable
            raise _misplaced(block, f"{path}[{j}].type", "assistant")
    reasoning = "\n".join(thoughts) if thoughts else None
    return Message(Role.ASSISTANT, "\n".join(texts), reasoning=reasoning, tool_calls=tuple(calls))


def _tools(tools: list[_Tool]) -> tuple[ToolSpec, ...]:
    specs = []
    for j, tool in enumerate(tools):
        if tool.input_schema is None:
            if tool.type not in (None, "custom"):
                continue  # a server tool (web search, code execution): Anthropic runs those, we cannot
            raise InvalidRequest(f"tools[{j}].input_schema: Field required", field=f"tools[{j}].input_schema")
        specs.append(ToolSpec(tool.name, tool.description or "", tool.input_schema))
    return tuple(specs)


def _translate(request: _Request) -> ChatRequest:
    messages: list[Message] = []
    if request.system is not None and (system := _system_text(request.system)):
        messages.append(Message(Role.SYSTEM, system))
    for i, message in enumerate(request.messages):
        path = f"messages[{i}].content"
        if message.role == "user":
            messages.extend(_user(message.content, path))
        elif message.role == "assistant":
            messages.append(_assistant(message.content, path))
        else:
            messages.append(Message(Role.SYSTEM, _plain_text(message.content, path, "system")))
    return ChatRequest(
        model=request.model,
        messages=tuple(messages),
        tools=_tools(request.tools or []),
        max_tokens=request.max_tokens,
        sampling=not_none(
            temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, stop=request.stop_sequences
        ),
        stream=request.stream,
    )


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


def _message_response(completion: Completion) -> dict[str, Any]:
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


def _error_body(error: PolarError) -> dict[str, Any]:
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
        return [_frame(_error_body(error))]

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


class AnthropicCodec:
    """The ``anthropic_messages`` protocol codec (see the module docstring for the mapping)."""

    name = "anthropic_messages"

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> ChatRequest:
        """The model and streaming come from the body; the path carries neither."""
        return _translate(parse_body(_Request, body))

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        return _message_response(completion)

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> AnthropicStream:
        return AnthropicStream(meta)

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        """The status code is the error's own: a 503 stays 503 (``overloaded_error``), though Anthropic
        itself answers overload with 529, because proxies and load balancers understand 503."""
        return error.status_code, _error_body(error)


CODEC = AnthropicCodec()
