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
- Tools with ``defer_loading: true`` become deferred ToolSpecs (declared, not listed up front); a
  ``tool_reference`` block in a tool result (a tool search loading one: Claude Code's ToolSearch) becomes
  ``[tool loaded: NAME]`` followed by that tool's definition as JSON when it is a declared deferred tool, as
  Anthropic expands the reference in place (so loading a tool changes no earlier token); server-tool blocks
  (``server_tool_use``, ``*_tool_result``, ``container_upload``) are skipped in assistant turns and a placeholder
  in user turns. Every block type the pinned SDK defines is accepted (a test compares them).
- Image, document, search-result and browser-state blocks (Claude Code's Read returns images and PDFs as tool
  results) become a placeholder text, ``[image omitted: this model cannot see images]``, rather than a 400: the
  model reads text only, and a 400 would end the agent's loop. The OpenAI codecs do the same.
- Custom tools (``input_schema``) become ToolSpecs; server tools (a ``type`` such as
  ``web_search_20250305`` and no schema) run on Anthropic's side and are skipped.
- ``temperature``, ``top_p``, ``top_k`` and ``stop_sequences`` (as ``stop``) go to ``sampling``;
  ``cache_control``, ``metadata``, ``thinking``, ``context_management``, ``output_config`` and
  ``service_tier`` are ignored; ``tool_choice`` is checked (``auto``, ``any``, ``tool`` with a name, ``none``) but
  not enforced.

Completion -> Message: a thinking block (its signature is base64(sha256(text)): deterministic, opaque),
a text block, one ``tool_use`` block per call (ids ``toolu_``-prefixed), or one empty text block when
the model produced nothing. Usage reports every prompt token as ``input_tokens``; no cache accounting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.errors import InvalidRequest, Overloaded, PolarError
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire._wire import media_placeholder, not_none, parse_body
from polar.wire.anthropic_output import (
    AnthropicStream,
    count_tokens_response,
    error_body,
    message_response,
    thinking_signature,
)
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion
from polar.wire.tool_schema import check_schema

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

    type: Literal["image", "document", "search_result", "browser_state"]

    @property
    def placeholder(self) -> str:
        return media_placeholder(self.type)


class _ToolReference(_Wire):
    """A deferred tool loaded by a tool search (Claude Code's ``ToolSearch``): the model reads which one, and
    its definition when the request declares it deferred (not listed up front)."""

    type: Literal["tool_reference"]
    tool_name: str

    @property
    def placeholder(self) -> str:
        return f"[tool loaded: {self.tool_name}]"

    def text(self, tools: Mapping[str, ToolSpec]) -> str:
        tool = tools.get(self.tool_name)
        if tool is None or not tool.deferred:
            return self.placeholder
        return f"{self.placeholder}\n{json.dumps(tool.as_json(), ensure_ascii=False)}"


class _ServerBlock(_Wire):
    """Blocks of Anthropic's server-side tools (web search, code execution, tool search, uploads). Anthropic runs
    those, this gateway does not: in an assistant turn they are skipped (no reply of ours holds them), in a user
    turn they become a placeholder text."""

    type: Literal[
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    ]

    @property
    def placeholder(self) -> str:
        return media_placeholder(self.type)


_ResultPart = Annotated[_Text | _Media | _ToolReference, Field(discriminator="type")]


class _ToolResult(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[_ResultPart] = ""
    is_error: bool = False


_Block = Annotated[
    _Text | _Thinking | _RedactedThinking | _ToolUse | _ToolResult | _Media | _ServerBlock,
    Field(discriminator="type"),
]


class _Message(_Wire):
    role: Literal["user", "assistant", "system"]
    content: str | list[_Block]


class _Tool(_Wire):
    name: str
    type: str | None = None  # absent or "custom" for client tools; a versioned name for server tools
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool = False


class _ToolChoice(_Wire):
    """Read only to refuse what Anthropic refuses (an unknown type, ``tool`` without a name); otherwise ignored."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> _ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the tool\'s name')
        return self


class _ThinkingOption(_Wire):
    """``thinking``: ignored (the model thinks as its template says), but held to Anthropic's documented range."""

    type: str | None = None
    budget_tokens: int | None = Field(default=None, ge=1024)


class _Request(_Wire):
    # Scalars first: errors are reported in field order, and a wrong max_tokens is easier to act on than a
    # problem deep inside the conversation. Ranges are Anthropic's documented ones (docs/limits.md).
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    thinking: _ThinkingOption | None = None
    stop_sequences: list[str] | None = None
    system: str | list[_Text] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    messages: list[_Message] = Field(min_length=1)


# --- request ---------------------------------------------------------------------------------------------


def _misplaced(block: BaseModel, path: str, role: str) -> InvalidRequest:
    kind = getattr(block, "type", "?")
    return InvalidRequest(f"{path}: {kind} blocks are not allowed in {role} content", field=path)


def _system_text(system: str | list[_Text]) -> str:
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    kept = ("\n".join(line for line in text.split("\n") if not line.startswith(BILLING_HEADER)) for text in texts)
    return "\n".join(text for text in kept if text)


def _plain_text(
    content: str | list[Any], path: str, role: str, tools: Mapping[str, ToolSpec] = MappingProxyType({})
) -> str:
    """Content that holds text only (system messages, tool results), "\\n"-joined; media as placeholders,
    loaded tools as their definitions (``tools``: the declared ones by name)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        if isinstance(block, _Text):
            texts.append(block.text)
        elif isinstance(block, _ToolReference) and role != "system":
            texts.append(block.text(tools))
        elif isinstance(block, _Media) and role != "system":
            texts.append(block.placeholder)
        else:
            raise _misplaced(block, f"{path}[{j}].type", role)
    return "\n".join(texts)


def _user(content: str | list[Any], path: str, tools: Mapping[str, ToolSpec]) -> list[Message]:
    if isinstance(content, str):
        return [Message(Role.USER, content)]
    results: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        if isinstance(block, _Text):
            texts.append(block.text)
        elif isinstance(block, _Media | _ServerBlock):
            texts.append(block.placeholder)
        elif isinstance(block, _ToolResult):
            text = _plain_text(block.content, f"{path}[{j}].content", "tool_result", tools)
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
        elif not isinstance(block, _RedactedThinking | _ServerBlock):  # another model's, or Anthropic's own
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
        check_schema(tool.input_schema, f"tools[{j}].input_schema")
        specs.append(ToolSpec(tool.name, tool.description or "", tool.input_schema, deferred=tool.defer_loading))
    return tuple(specs)


def _translate(request: _Request) -> ChatRequest:
    budget = request.thinking.budget_tokens if request.thinking is not None else None
    if budget is not None and budget >= request.max_tokens:
        field = "thinking.budget_tokens"
        raise InvalidRequest(f"{field}: must be less than max_tokens ({request.max_tokens})", field=field)
    messages: list[Message] = []
    tools = _tools(request.tools or [])
    by_name = {tool.name: tool for tool in tools}
    if request.system is not None and (system := _system_text(request.system)):
        messages.append(Message(Role.SYSTEM, system))
    for i, message in enumerate(request.messages):
        path = f"messages[{i}].content"
        if message.role == "user":
            messages.extend(_user(message.content, path, by_name))
        elif message.role == "assistant":
            messages.append(_assistant(message.content, path))
        else:
            messages.append(Message(Role.SYSTEM, _plain_text(message.content, path, "system")))
    return ChatRequest(
        model=request.model,
        messages=tuple(messages),
        tools=tools,
        max_tokens=request.max_tokens,
        sampling=not_none(
            temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, stop=request.stop_sequences
        ),
        stream=request.stream,
    )


class AnthropicCodec:
    """The ``anthropic_messages`` protocol codec (see the module docstring for the mapping)."""

    name = "anthropic_messages"
    messages_field = "messages"
    key_in_query = False
    count_tokens_defaults: Mapping[str, Any] = MappingProxyType({"max_tokens": 1})

    def count_tools(self, body: Any) -> int:
        """Tools with an ``input_schema`` (server tools have none, and are not rendered)."""
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list):
            return 0
        return sum(1 for t in tools if isinstance(t, dict) and t.get("input_schema") is not None)

    def count_messages(self, body: Any) -> int:
        """Messages (objects): each is at least one message (a user one of tool results only, one per result)."""
        messages = body.get("messages") if isinstance(body, dict) else None
        return sum(1 for m in messages if isinstance(m, dict)) if isinstance(messages, list) else 0

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> ChatRequest:
        """The model and streaming come from the body; the path carries neither."""
        return _translate(parse_body(_Request, body))

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        return message_response(completion)

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> AnthropicStream:
        return AnthropicStream(meta)

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        """The status code is the error's own: a 503 stays 503 (``overloaded_error``), though Anthropic
        itself answers overload with 529, because proxies and load balancers understand 503. A full
        inference server (``Overloaded``) is Anthropic's own 529, which its SDK and CLI retry."""
        if isinstance(error, Overloaded):
            return 529, {"type": "error", "error": {"type": "overloaded_error", "message": error.message}}
        return error.status_code, error_body(error)


CODEC = AnthropicCodec()

__all__ = ["CODEC", "AnthropicCodec", "AnthropicStream", "count_tokens_response", "thinking_signature"]
