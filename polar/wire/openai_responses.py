"""OpenAI Responses (``POST /v1/responses``): Codex, OpenCode's openai provider, Pi.

Request → canonical:

- ``instructions`` is a leading system message; ``input`` is a string (one user message) or a list of
  items. ``system``/``developer`` messages become system messages where they stand.
- One model reply arrives as several items (reasoning, message, function calls). They are grouped back
  into one assistant message, because the template renders one assistant turn per reply: a ``reasoning``
  item or a second text message starts a new reply; calls join the reply being built; anything else (a
  user message, a tool output) ends it.
- ``custom_tool_call`` (Codex's freeform tools such as apply_patch) is a call whose arguments are
  ``{"input": text}``; ``local_shell_call``/``shell_call`` are calls named ``local_shell``/``shell`` whose
  arguments are the action's JSON. Tool outputs (string or ``input_text`` parts) are tool messages.
- Reasoning text comes from our own ``encrypted_content`` token (exact), else ``content[].text``, else
  ``summary[].text``; an opaque token from another provider carries no text we can read.
- Tools: ``function`` and ``custom`` tools, also inside ``namespace`` tools and ``additional_tools`` items.
  A namespaced tool is offered as ``namespace.name`` (function names cannot contain a dot, so this never
  collides). A custom tool takes ``{"input": string}``; its grammar, if any, goes in that field's
  description. Provider-hosted and built-in tools (web_search, file_search, local_shell, shell, computer,
  mcp, ...) are skipped: the gateway cannot run them and never emits their calls.
- ``previous_response_id``/``conversation``/``item_reference`` need server-side state and are refused.

Canonical → response: a ``response`` object whose output is a reasoning item (summary = the text,
``encrypted_content`` = ``"polar:" + base64(text)``, so the text comes back exactly), a message item, and
one ``function_call`` (or ``custom_tool_call`` for a custom tool, with the namespace split back out) per
call. Length and abort both end as status ``incomplete`` (reason ``max_output_tokens``). Streams carry the
full event sequence with ``sequence_number`` and end with ``response.completed``/``response.incomplete``.
That half (response object, items, SSE encoder) lives in ``openai_responses_output``.

Per-request context: ``parse_request`` returns an ``OpenAIResponsesRequest`` (a ``ChatRequest`` that also
maps each offered tool name to its kind and namespace); pass it back as ``request=`` to ``response`` and
``stream_encoder``. Without it every call is emitted as a plain ``function_call`` under the offered name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Field, Tag

from polar.errors import InvalidRequest, PolarError
from polar.tokens.messages import Message, Role, ToolCall
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion
from polar.wire.openai_common import (
    Content,
    MaxTokens,
    ModelName,
    ReasoningEffort,
    SamplingWire,
    Text,
    WireModel,
    checked_arguments,
    content_text,
    error_response,
    index_path,
    str_or_list,
    validate,
)
from polar.wire.openai_responses_output import (
    ResponsesStreamEncoder,
    ToolRoute,
    decode_reasoning,
    output_items,
    response_json,
)
from polar.wire.openai_responses_tools import OfferedTools, flat_name

# ---------------------------------------------------------------------------------------------- wire models


# Input items are validated one by one, by type.
Input = Annotated[Text | Annotated[list[Any], Tag("list")], str_or_list("a string or an array of input items")]
ShellOutput = Annotated[
    Text | Annotated[list[dict[str, Any]], Tag("list")], str_or_list("a string or an array of output chunks")
]


class ReasoningWire(WireModel):
    effort: ReasoningEffort | None = None


class ResponsesBody(SamplingWire):
    model: ModelName
    input: Input
    instructions: str | None = None
    tools: list[Any] | None = None
    reasoning: ReasoningWire | None = None
    max_output_tokens: MaxTokens | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None


class MessageItem(WireModel):
    role: Literal["user", "system", "developer", "assistant"]
    content: Content


class FunctionCallItem(WireModel):
    call_id: str
    name: str
    arguments: str  # JSON text; kept verbatim
    namespace: str | None = None


class CustomToolCallItem(WireModel):
    call_id: str
    name: str
    input: str
    namespace: str | None = None


class CallOutputItem(WireModel):
    call_id: str
    output: Content


class TextPart(WireModel):
    text: str


class ReasoningItem(WireModel):
    summary: list[TextPart] = Field(default_factory=list)
    content: list[TextPart] | None = None
    encrypted_content: str | None = None


class ShellCallItem(WireModel):
    call_id: str
    action: dict[str, Any]


class LocalShellOutputItem(WireModel):
    id: str | None = None  # the SDK names the call's id ``id`` on this item
    call_id: str | None = None
    output: str


class ShellOutputItem(WireModel):
    call_id: str
    output: ShellOutput


class AdditionalToolsItem(WireModel):
    tools: list[Any]


@dataclass(frozen=True)
class OpenAIResponsesRequest(ChatRequest):
    """A ChatRequest plus the route of each offered tool (needed to emit custom and namespaced calls)."""

    routes: Mapping[str, ToolRoute] = field(default_factory=dict, hash=False)


# ------------------------------------------------------------------------------------------------ history


def _reasoning_text(item: ReasoningItem, path: str) -> str | None:
    if item.encrypted_content is not None:
        text = decode_reasoning(item.encrypted_content, f"{path}.encrypted_content")
        if text is not None:
            return text
    parts = item.content or item.summary
    return "\n\n".join(p.text for p in parts) or None


_OUTPUT_ITEMS = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output", "shell_call_output"}
)


def _own_message(item: dict[str, Any]) -> bool:
    """Whether an input item is surely a message of its own: a user message, or a tool's output."""
    kind = item.get("type", "message")
    return (isinstance(kind, str) and kind in _OUTPUT_ITEMS) or (kind == "message" and item.get("role") == "user")


class _History:
    """Input items → canonical messages, one assistant message per model reply."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.tools = OfferedTools()
        self._names: dict[str, str] = {}  # call id → tool name, to name tool results
        self._reasoning: str | None = None
        self._text: str | None = None
        self._calls: list[ToolCall] = []
        self._open = False
        self._ids: list[str] = []  # echoed item ids of the open reply

    def item(self, raw: Any, path: str) -> None:
        kind = raw.get("type", "message") if isinstance(raw, dict) else None
        if kind == "message" or kind is None:
            self._message(validate(MessageItem, raw, prefix=path), path)
            if isinstance(raw, dict) and raw.get("role") == "assistant":
                self._item_id(raw)
        elif kind in ("function_call", "custom_tool_call"):
            call: FunctionCallItem | CustomToolCallItem
            if kind == "function_call":
                call = validate(FunctionCallItem, raw, prefix=path)
                arguments = checked_arguments(call.arguments, f"{path}.arguments")
            else:
                call = validate(CustomToolCallItem, raw, prefix=path)
                arguments = _custom_arguments(call.input)
            self._call(ToolCall(flat_name(call.name, call.namespace), arguments, call.call_id))
            self._item_id(raw)
        elif kind in ("local_shell_call", "shell_call"):
            shell = validate(ShellCallItem, raw, prefix=path)
            name = "local_shell" if kind == "local_shell_call" else "shell"
            self._call(ToolCall(name, json.dumps(shell.action, ensure_ascii=False), shell.call_id))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = validate(CallOutputItem, raw, prefix=path)
            self._result(content_text(out.output, f"{path}.output"), out.call_id)
        elif kind == "local_shell_call_output":
            local = validate(LocalShellOutputItem, raw, prefix=path)
            self._result(local.output, local.call_id or local.id)
        elif kind == "shell_call_output":
            shell_out = validate(ShellOutputItem, raw, prefix=path)
            text = shell_out.output if isinstance(shell_out.output, str) else json.dumps(shell_out.output)
            self._result(text, shell_out.call_id)
        elif kind == "reasoning":
            self._reason(_reasoning_text(validate(ReasoningItem, raw, prefix=path), path))
            self._item_id(raw)
        elif kind == "additional_tools":
            self.tools.add_all(validate(AdditionalToolsItem, raw, prefix=path).tools, f"{path}.tools")
        else:
            self._unsupported(kind, path)

    @staticmethod
    def _unsupported(kind: Any, path: str) -> None:
        if not isinstance(kind, str):
            raise InvalidRequest(f"{path}.type: expected a string", field=f"{path}.type")
        if kind == "item_reference":
            raise InvalidRequest(f"{path}: item references need stored responses; send the items", field=path)
        raise InvalidRequest(f"{path}.type: unsupported input item type {kind!r}", field=f"{path}.type")

    def _message(self, item: MessageItem, path: str) -> None:
        text = content_text(item.content, f"{path}.content")
        if item.role == "assistant":
            if self._text is not None or self._calls:
                self.flush()  # a second text message (or text after calls) is a reply of its own
            self._open, self._text = True, text
        else:
            self.flush()
            self.messages.append(Message(Role.USER if item.role == "user" else Role.SYSTEM, text))

    def _item_id(self, raw: dict[str, Any]) -> None:
        """Keep an echoed output item's id (``msg_``/``rs_``/``fc_``...): a witness of the reply it came from."""
        item_id = raw.get("id")
        if isinstance(item_id, str) and item_id:
            self._ids.append(item_id)

    def _call(self, call: ToolCall) -> None:
        self._open = True
        self._calls.append(call)
        if call.id is not None:
            self._names[call.id] = call.name

    def _result(self, text: str, call_id: str | None) -> None:
        self.flush()
        self.messages.append(Message(Role.TOOL, text, tool_call_id=call_id, name=self._names.get(call_id or "")))

    def _reason(self, text: str | None) -> None:
        if self._text is not None or self._calls:
            self.flush()  # reasoning opens the next reply
        self._open = True
        if text:
            self._reasoning = text if self._reasoning is None else f"{self._reasoning}\n\n{text}"

    def flush(self) -> None:
        if self._open:
            calls = tuple(self._calls)
            self.messages.append(
                Message(
                    Role.ASSISTANT,
                    self._text or "",
                    self._reasoning,
                    calls,
                    item_ids=tuple(self._ids) if self._ids else (),
                )
            )
        self._reasoning, self._text, self._calls, self._open, self._ids = None, None, [], False, []


def _custom_arguments(text: str) -> str:
    return json.dumps({"input": text}, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------- codec


def _routes(request: ChatRequest | None) -> Mapping[str, ToolRoute]:
    return request.routes if isinstance(request, OpenAIResponsesRequest) else {}


class OpenAIResponsesCodec:
    """The ``openai_responses`` codec. ``response``/``stream_encoder`` take an optional ``request=`` (the
    parsed request) so custom and namespaced tool calls go back in the shape the harness declared."""

    name = "openai_responses"
    messages_field = "input"
    key_in_query = False
    count_tokens_defaults: Mapping[str, Any] = MappingProxyType({})

    def count_tools(self, body: Any) -> int:
        """Top-level ``function`` and ``custom`` tools of distinct names (the first declaration of a name wins)."""
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list):
            return 0
        kinds = ("function", "custom")
        return len({t.get("name") for t in tools if isinstance(t, dict) and t.get("type") in kinds})

    def count_messages(self, body: Any) -> int:
        """User message items and tool outputs, each a message of its own (a model reply's items are grouped into
        one assistant message, so they are not counted); a string ``input`` is one user message."""
        items = body.get("input") if isinstance(body, dict) else None
        if isinstance(items, str):
            return 1
        if not isinstance(items, list):
            return 0
        return sum(1 for item in items if isinstance(item, dict) and _own_message(item))

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> OpenAIResponsesRequest:
        wire = validate(ResponsesBody, body)
        for stateful in ("previous_response_id", "conversation"):
            if getattr(wire, stateful) is not None:
                raise InvalidRequest(
                    f"{stateful}: the gateway keeps no response state; send the whole input", field=stateful
                )
        if not wire.input:  # OpenAI refuses an empty input too: there is nothing to answer
            raise InvalidRequest("input: must be a non-empty string or a non-empty array of items", field="input")
        history = _History()
        if wire.instructions:
            history.messages.append(Message(Role.SYSTEM, wire.instructions))
        history.tools.add_all(wire.tools or [], "tools")
        if isinstance(wire.input, str):
            history.messages.append(Message(Role.USER, wire.input))
        else:
            for index, item in enumerate(wire.input):
                history.item(item, index_path("input", index))
            history.flush()
        return OpenAIResponsesRequest(
            model=wire.model,
            messages=tuple(history.messages),
            tools=tuple(history.tools.specs),
            max_tokens=wire.max_output_tokens,
            sampling=wire.sampling(),
            stream=bool(wire.stream),
            routes=history.tools.routes,
        )

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        output = output_items(completion, _routes(request))
        return response_json(completion.id, completion.created, completion.model, output, completion)

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(meta, _routes(request))

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        return error_response(error, context_param="input")


CODEC = OpenAIResponsesCodec()
