"""The codec contract: one module per wire family implements ``ProtocolCodec``.

A codec is pure translation. It never talks to the backend or the store; it turns a request body into a
``ChatRequest``, a ``Completion`` into the provider's JSON, parser events into the provider's SSE frames,
and a ``PolarError`` into the provider's error shape. Streams are driven by the gateway:

    encoder = codec.stream_encoder(meta, request=request)
    frames = encoder.start()
    for event in parser events (TextDelta, ReasoningDelta, ToolCallParsed): frames += encoder.on_event(event)
    frames += encoder.finish(completion)        # after the capture is committed
    # or, on failure after start: frames += encoder.error(err)

Frames are complete SSE strings ("event: x\\ndata: {...}\\n\\n" or "data: {...}\\n\\n").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from polar.errors import InvalidRequest, PolarError
from polar.tokens.messages import Role
from polar.tokens.parsers import Event
from polar.wire.body_digest import Repeats
from polar.wire.canonical import ChatRequest, Completion


@dataclass(frozen=True)
class StreamMeta:
    """What a stream needs to know before the first token: ids and the prompt size (for usage)."""

    completion_id: str
    model: str
    created: int
    prompt_tokens: int


class StreamEncoder(Protocol):
    def start(self) -> list[str]: ...

    def on_event(self, event: Event) -> list[str]: ...

    def finish(self, completion: Completion) -> list[str]: ...

    def error(self, error: PolarError) -> list[str]: ...


class ProtocolCodec(Protocol):
    name: str  # stored in captures.protocol: openai_chat | openai_responses | anthropic_messages | gemini
    # Where the provider's clients may put the key besides its headers: Google's take ``?key=`` on the URL.
    key_in_query: bool
    # What a token-count body lacks to be a valid request of this protocol (Anthropic's has no max_tokens).
    count_tokens_defaults: Mapping[str, Any]
    messages_field: str  # where a body holds its conversation: messages | input | contents

    def parse_request(
        self, body: Any, *, path_model: str | None = None, path_stream: bool | None = None
    ) -> ChatRequest:
        """Validate and translate a request body. Raises InvalidRequest naming the offending field.

        ``path_model`` / ``path_stream`` carry what Gemini puts in the URL (model, streamGenerateContent).
        """
        ...

    def count_tools(self, body: Any) -> int:
        """How many tool definitions a render of ``body`` surely writes, counted on the decoded body before it is
        checked or validated (cheap: no walk); 0 for a malformed body, whose validation names the problem. The
        cost bound (``polar.proxy.call.cost``) uses it to refuse a body of 100,000 tools before any work."""
        ...

    def count_messages(self, body: Any) -> int:
        """At least how many messages other than system ones a render of ``body`` writes, counted on the decoded
        body before it is checked or validated (cheap: no conversion); what is malformed is not counted. The cost
        bound charges each the chat template's per-message tokens (``polar.proxy.call.cost``), so a body of
        800,000 messages is refused before any work per message."""
        ...

    def response(self, completion: Completion, *, request: ChatRequest | None = None) -> dict[str, Any]:
        """``request`` is what ``parse_request`` returned (codecs may carry protocol details in a subclass)."""
        ...

    def stream_encoder(self, meta: StreamMeta, *, request: ChatRequest | None = None) -> StreamEncoder: ...

    def error_response(self, error: PolarError) -> tuple[int, dict[str, Any]]:
        """Status code and body, in the provider's error shape, for an error before any byte was sent."""
        ...


def parse_after(
    codec: ProtocolCodec,
    body: Any,
    prior: tuple[Repeats, ChatRequest] | None,
    *,
    path_model: str | None = None,
    path_stream: bool | None = None,
) -> ChatRequest:
    """``codec.parse_request(body)``; when ``prior`` (what ``body`` repeats of an earlier body of the session, and
    that body's decode) is given and the codec can (``parse_extension``), only what ``body`` adds to it is
    validated and converted, so an agent's turn costs what it adds, not its whole history. The result is the same
    either way, but for the earlier messages, which are then the prior's own (sealed, when a session's history
    held them: ``Message.sealed``); its tool results all answer a call (``check_tool_results``)."""
    extended = parse_extended(codec, body, prior[0], prior[1]) if prior is not None else None
    if extended is not None:
        return extended
    return check_tool_results(codec.parse_request(body, path_model=path_model, path_stream=path_stream))


def parse_extended(
    codec: ProtocolCodec, body: Any, repeats: Repeats, prior: ChatRequest, cut: int = 0
) -> ChatRequest | None:
    """``parse_after``'s decode on ``prior``: ``body`` converted from what it adds alone, when the codec can
    (``parse_extension``) and ``body`` extends ``prior``; else None. ``cut``: ``body`` was decoded without its first
    ``cut`` messages (``json_guard.CutBody``: they are ``prior``'s), so None leaves it to be decoded whole."""
    extend = getattr(codec, "parse_extension", None)
    extended = extend(body, repeats, prior, cut=cut) if extend is not None else None
    # The prior's messages were checked when it was parsed: only the new ones are.
    return check_tool_results(extended, start=len(prior.messages)) if extended is not None else None


def check_tool_results(request: ChatRequest, start: int = 0) -> ChatRequest:
    """``request``, unless a tool result names a call id that no earlier assistant message made: every provider
    refuses such an orphan result (OpenAI: a ``tool`` message must answer a preceding ``tool_calls``;
    Anthropic: a ``tool_result`` needs its ``tool_use``; Responses: a ``function_call_output`` its
    ``function_call``). A result without an id (Gemini matches by name) is not checked. ``start``: the messages
    before it are known to pass (an extension of a checked request); their calls are read only when a new
    result answers none of the new messages' calls, so an agent's turn costs what it adds."""
    called: set[str] = set()
    earlier: set[str] | None = None  # the calls of messages[:start], read at most once
    for message in request.messages[start:]:
        if message.role is Role.ASSISTANT:
            called.update(call.id for call in message.tool_calls if call.id)
        elif message.role is Role.TOOL and message.tool_call_id and message.tool_call_id not in called:
            if earlier is None:
                before = request.messages[:start]
                earlier = {c.id or "" for m in before if m.role is Role.ASSISTANT for c in m.tool_calls}
            if message.tool_call_id not in earlier:
                raise InvalidRequest(
                    f"tool_call_id: the tool result for call {message.tool_call_id!r:.80} answers no earlier tool call",
                    field="tool_call_id",
                )
    return request


def dumps_text(data: Any) -> str:
    """Compact JSON text (orjson; the standard encoder for what orjson refuses, e.g. a lone surrogate)."""
    try:
        return orjson.dumps(data).decode()
    except TypeError:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def sse(data: Any, event: str | None = None) -> str:
    """One SSE frame. Compact JSON, no ASCII escaping (the SDKs read UTF-8)."""
    payload = data if isinstance(data, str) else dumps_text(data)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
