"""The Anthropic Messages codec, read back by the real anthropic SDK over an in-process transport.

§1 requests (SDK-built and Claude Code-shaped), §2 replies through ``messages.create``, §3 streams through
``create(stream=True)`` and ``messages.stream()``, §4 errors, §5 junk bodies never raise anything but
InvalidRequest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import given, settings

from polar.errors import (
    AuthenticationError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    PolarError,
    StoreError,
)
from polar.inference import FinishReason
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.tokens.parsers import (
    Event,
    MalformedToolCall,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)
from polar.wire.anthropic import (
    CODEC,
    count_tokens_response,
    thinking_signature,
)
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion, Usage
from tests.wire.junk import junk_bodies

PROMPT_TOKENS = 1234
WRITE = ToolCall("Write", '{"file_path": "hello.txt", "content": "hi"}', id="call_w1")
BASH = ToolCall("Bash", '{"command": "ls -la"}', id="toolu_b2")
EVENTS: list[Event] = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("a file."),
    TextDelta("Writing "),
    TextDelta("it now."),
    ToolCallParsed(WRITE, 0),
    MalformedToolCall("<tool_call>oops", "unclosed"),
    ToolCallParsed(BASH, 1),
]
TOOLS = [
    {"name": "Write", "description": "Write a file", "input_schema": {"type": "object", "properties": {}}},
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}},
]


def completion(**overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "id": "gen-1",
        "model": "capture-model",
        "created": 1700000000,
        "content": "Writing it now.",
        "reasoning": "The user wants a file.",
        "tool_calls": (WRITE, BASH),
        "finish_reason": FinishReason.STOP,
        "usage": Usage(PROMPT_TOKENS, 42),
    }
    return Completion(**(fields | overrides))


META = StreamMeta(completion_id="gen-1", model="capture-model", created=1700000000, prompt_tokens=PROMPT_TOKENS)


def sse_body(events: list[Event], done: Completion | None = None, error: PolarError | None = None) -> str:
    encoder = CODEC.stream_encoder(META)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    frames += encoder.error(error) if error is not None else encoder.finish(done or completion())
    return "".join(frames)


class Gateway:
    """A MockTransport handler that parses each body with the codec and answers with a scripted reply."""

    def __init__(self, reply: Callable[[ChatRequest], httpx.Response] | None = None):
        self.requests: list[ChatRequest] = []
        self.urls: list[str] = []
        self._reply = reply

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        chat = CODEC.parse_request(json.loads(request.content))
        self.requests.append(chat)
        if self._reply is not None:
            return self._reply(chat)
        if chat.stream:
            return httpx.Response(200, text=sse_body(EVENTS), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=CODEC.response(completion()))

    def client(self) -> anthropic.Anthropic:
        transport = httpx.MockTransport(self)
        return anthropic.Anthropic(
            api_key="k", base_url="http://gateway.test", http_client=httpx.Client(transport=transport), max_retries=0
        )

    def async_client(self) -> anthropic.AsyncAnthropic:
        transport = httpx.MockTransport(self)
        return anthropic.AsyncAnthropic(
            api_key="k",
            base_url="http://gateway.test",
            http_client=httpx.AsyncClient(transport=transport),
            max_retries=0,
        )


CREATE_ARGS: dict[str, Any] = {
    "model": "capture-model",
    "max_tokens": 512,
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "Create hello.txt"}],
    "tools": TOOLS,
    "temperature": 0.7,
    "top_k": 20,
    "stop_sequences": ["<END>"],
}


# §1 requests ----------------------------------------------------------------------------------------------


def test_sdk_request_becomes_the_canonical_request() -> None:
    gateway = Gateway()
    gateway.client().messages.create(**CREATE_ARGS)
    (chat,) = gateway.requests
    assert gateway.urls == ["http://gateway.test/v1/messages"]
    assert chat.model == "capture-model" and chat.max_tokens == 512 and chat.stream is False
    assert chat.messages == (Message(Role.SYSTEM, "You are terse."), Message(Role.USER, "Create hello.txt"))
    assert chat.tools == tuple(ToolSpec(t["name"], t["description"], t["input_schema"]) for t in TOOLS)
    assert chat.sampling == {"temperature": 0.7, "top_k": 20, "stop": ["<END>"]}


CLAUDE_CODE_TURN_2: dict[str, Any] = {
    "model": "capture-model",
    "max_tokens": 32000,
    "stream": True,
    "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "tool_choice": {"type": "auto"},
    "system": [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=sdk-cli; cch=1f2e;",
        },
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Main prompt.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "messages": [
        {"role": "system", "content": "Agent types: general-purpose."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>Today is 2026-11-29.</system-reminder>"},
                {
                    "type": "text",
                    "text": "Create a file hello.txt containing hi",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use Write.", "signature": "c2ln"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Creating it."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Write",
                    "input": {"file_path": "hello.txt", "content": "hi ✓"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "File created",
                    "cache_control": {"type": "ephemeral"},
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "is_error": True,
                    "content": [{"type": "text", "text": "denied"}],
                },
                {"type": "text", "text": "<system-reminder>Todo list is empty.</system-reminder>"},
            ],
        },
    ],
    "tools": [
        {
            "name": "Write",
            "description": "Write a file",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "custom", "name": "Bash", "input_schema": {"type": "object"}},
    ],
}


def test_claude_code_turn_two() -> None:
    chat = CODEC.parse_request(CLAUDE_CODE_TURN_2)
    assert chat.stream is True and chat.max_tokens == 32000 and chat.sampling == {}
    assert chat.messages == (
        Message(Role.SYSTEM, "You are a Claude agent.\nMain prompt."),  # the billing header is gone
        Message(Role.SYSTEM, "Agent types: general-purpose."),
        Message(
            Role.USER, "<system-reminder>Today is 2026-11-29.</system-reminder>\nCreate a file hello.txt containing hi"
        ),
        Message(
            Role.ASSISTANT,
            "Creating it.",
            reasoning="Use Write.",
            tool_calls=(ToolCall("Write", '{"file_path": "hello.txt", "content": "hi ✓"}', id="toolu_01"),),
        ),
        Message(Role.TOOL, "File created", tool_call_id="toolu_01"),
        Message(Role.TOOL, "Error: denied", tool_call_id="toolu_02"),
        Message(Role.USER, "<system-reminder>Todo list is empty.</system-reminder>"),
    )
    assert [tool.name for tool in chat.tools] == ["Write", "Bash"]  # the server tool is skipped


def test_billing_header_line_is_stripped_from_a_string_system_too() -> None:
    body = {**CREATE_ARGS, "system": "x-anthropic-billing-header: cc_version=1;\nYou are terse."}
    assert CODEC.parse_request(body).messages[0] == Message(Role.SYSTEM, "You are terse.")
    only_header = {**CREATE_ARGS, "system": [{"type": "text", "text": "x-anthropic-billing-header: a;"}]}
    assert CODEC.parse_request(only_header).messages[0].role is Role.USER


def test_images_become_placeholders_not_errors() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    body = {
        **CREATE_ARGS,
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}, image]},
        ],
    }
    messages = CODEC.parse_request(body).messages[1:]
    assert messages[1] == Message(Role.TOOL, "[image omitted: this model cannot see images]", tool_call_id="toolu_1")
    assert messages[2] == Message(Role.USER, "[image omitted: this model cannot see images]")


# §2 replies -----------------------------------------------------------------------------------------------


def test_messages_create_reads_the_reply() -> None:
    message = Gateway().client().messages.create(**CREATE_ARGS)
    thinking, text, write, bash = message.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants a file."
    assert thinking.signature == thinking_signature("The user wants a file.")
    assert text.type == "text" and text.text == "Writing it now."
    assert (write.type, write.id, write.name, write.input) == (
        "tool_use",
        "toolu_call_w1",
        "Write",
        json.loads(WRITE.arguments),
    )
    assert (bash.type, bash.id, bash.input) == ("tool_use", "toolu_b2", {"command": "ls -la"})
    assert message.id == "msg_gen-1" and message.model == "capture-model"
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT_TOKENS, 42)


@pytest.mark.parametrize(
    ("overrides", "stop_reason", "stop_sequence"),
    [
        ({"tool_calls": ()}, "end_turn", None),
        ({"tool_calls": (), "finish_reason": FinishReason.LENGTH}, "max_tokens", None),
        ({"tool_calls": (), "matched_stop": "<END>"}, "stop_sequence", "<END>"),
        ({"tool_calls": (), "matched_stop": 151645}, "end_turn", None),  # a stop token is an ordinary end
        ({"finish_reason": FinishReason.LENGTH}, "tool_use", None),  # complete calls are still runnable
        ({"tool_calls": (), "finish_reason": FinishReason.ABORT}, "end_turn", None),
    ],
)
def test_stop_reasons(overrides: dict[str, Any], stop_reason: str, stop_sequence: str | None) -> None:
    body = CODEC.response(completion(**overrides))
    message = anthropic.types.Message.model_validate(body)
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, stop_sequence)
    streamed = _final_message(sse_body([], completion(**overrides)))
    assert (streamed.stop_reason, streamed.stop_sequence) == (stop_reason, stop_sequence)


def test_an_empty_reply_is_one_empty_text_block() -> None:
    empty = completion(content="", reasoning=None, tool_calls=())
    message = anthropic.types.Message.model_validate(CODEC.response(empty))
    assert [(b.type, b.text) for b in message.content] == [("text", "")]  # type: ignore[union-attr]
    streamed = _final_message(sse_body([], empty))
    assert [(b.type, b.text) for b in streamed.content] == [("text", "")]  # type: ignore[union-attr]


def test_count_tokens_response() -> None:
    assert anthropic.types.MessageTokensCount.model_validate(count_tokens_response(77)).input_tokens == 77


# §3 streams -----------------------------------------------------------------------------------------------


def _final_message(body: str) -> anthropic.types.Message:
    gateway = Gateway(lambda _: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    with gateway.client().messages.stream(**CREATE_ARGS) as stream:
        return stream.get_final_message()


def test_create_stream_events() -> None:
    gateway = Gateway()
    events = list(gateway.client().messages.create(**CREATE_ARGS, stream=True))
    assert gateway.requests[0].stream is True
    kinds = [(e.type, getattr(e, "index", None)) for e in events]
    assert kinds[0] == ("message_start", None)
    start = events[0]
    assert start.type == "message_start" and start.message.usage.input_tokens == PROMPT_TOKENS  # not 0
    blocks = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use", "tool_use"]
    indexes = [
        e.index for e in events if e.type in ("content_block_start", "content_block_delta", "content_block_stop")
    ]
    assert indexes == sorted(indexes)
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert (
        deltas
        == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta", "text_delta"]
        + ["input_json_delta"] * 2
    )
    assert [e.type for e in events[-2:]] == ["message_delta", "message_stop"]
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens == 42  # type: ignore[union-attr]


def test_messages_stream_final_message() -> None:
    with Gateway().client().messages.stream(**CREATE_ARGS) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert texts == ["Writing ", "it now."]
    expected = anthropic.types.Message.model_validate(CODEC.response(completion()))
    assert message.model_dump(exclude_none=True) == expected.model_dump(exclude_none=True)  # same as non-streamed


async def test_async_stream_final_message() -> None:
    async with Gateway().async_client().messages.stream(**CREATE_ARGS) as stream:
        message = await stream.get_final_message()
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.usage.input_tokens == PROMPT_TOKENS and message.stop_reason == "tool_use"


def test_interleaved_reasoning_and_text_alternate_blocks() -> None:
    events: list[Event] = [
        TextDelta("a"),
        ReasoningDelta("r1"),
        ReasoningDelta(""),
        TextDelta("b"),
        ReasoningDelta("r2"),
    ]
    message = _final_message(sse_body(events, completion(tool_calls=())))
    assert [block.type for block in message.content] == ["text", "thinking", "text", "thinking"]
    assert message.content[1].signature == thinking_signature("r1")  # type: ignore[union-attr]
    assert message.content[3].signature == thinking_signature("r2")  # type: ignore[union-attr]


def test_error_mid_stream_raises_in_the_sdk() -> None:
    body = sse_body([TextDelta("partial")], error=BackendUnavailable("backend went away"))
    gateway = Gateway(lambda _: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    with pytest.raises(anthropic.APIStatusError) as caught:
        list(gateway.client().messages.create(**CREATE_ARGS, stream=True))
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "backend went away"}}


# §4 errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("messages: bad", field="messages"), 400, "invalid_request_error"),
        (StoreError("database is down"), 503, "overloaded_error"),
        (BackendUnavailable("connection refused"), 503, "overloaded_error"),
        (AuthenticationError("no such key"), 401, "authentication_error"),
        (PermissionDenied("session closed"), 403, "permission_error"),
        (NotFound("no such session"), 404, "not_found_error"),
        (PolarError("boom"), 500, "api_error"),
    ],
)
def test_error_response_shapes(error: PolarError, status: int, kind: str) -> None:
    assert CODEC.error_response(error) == (status, {"type": "error", "error": {"type": kind, "message": error.message}})


def test_context_length_error_reads_as_prompt_too_long() -> None:
    status, body = CODEC.error_response(ContextLengthExceeded(200_500, 131_072))
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: 200500 tokens > 131072 maximum")
    gateway = Gateway(lambda _: httpx.Response(status, json=body))
    with pytest.raises(anthropic.BadRequestError) as caught:
        gateway.client().messages.create(**CREATE_ARGS)
    assert "prompt is too long" in caught.value.message


def test_overloaded_error_reaches_the_sdk() -> None:
    status, body = CODEC.error_response(StoreError("database is down"))
    gateway = Gateway(lambda _: httpx.Response(status, json=body))
    with pytest.raises(anthropic.InternalServerError) as caught:
        gateway.client().messages.create(**CREATE_ARGS)
    assert caught.value.status_code == 503 and caught.value.body == body


# §5 bad input ---------------------------------------------------------------------------------------------

BASE = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ("{}", "body"),
        ({"max_tokens": 8, "messages": BASE["messages"]}, "model"),
        ({"model": "m", "messages": BASE["messages"]}, "max_tokens"),
        ({**BASE, "max_tokens": "8"}, "max_tokens"),
        ({**BASE, "max_tokens": 0}, "max_tokens"),
        ({**BASE, "messages": []}, "messages"),
        ({**BASE, "stream": "yes"}, "stream"),
        ({**BASE, "temperature": "hot"}, "temperature"),
        ({**BASE, "stop_sequences": "x"}, "stop_sequences"),
        ({**BASE, "system": [{"type": "image"}]}, "system[0].type"),
        ({**BASE, "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
        ({**BASE, "messages": [{"role": "user"}]}, "messages[0].content"),
        ({**BASE, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({**BASE, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
        ({**BASE, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        (
            {**BASE, "messages": [BASE["messages"][0], {"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[1].content[0].tool_use_id",
        ),
        (
            {
                **BASE,
                "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}],
            },
            "messages[0].content[0].type",
        ),
        (
            {
                **BASE,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": []}]}
                ],
            },
            "messages[0].content[0].input",
        ),
        (
            {
                **BASE,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text"}]}],
                    }
                ],
            },
            "messages[0].content[0].content[0].text",
        ),
        ({**BASE, "tools": [{"name": "t"}]}, "tools[0].input_schema"),
        ({**BASE, "tools": [{"name": "t", "input_schema": "{}"}]}, "tools[0].input_schema"),
    ],
)
def test_bad_requests_name_the_field(body: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field
    assert caught.value.message.startswith(field) or field == "body"


@settings(max_examples=300, deadline=None)
@given(junk_bodies(CLAUDE_CODE_TURN_2, max_edits=1))
def test_junk_raises_only_invalid_request(body: Any) -> None:
    try:
        chat = CODEC.parse_request(body)
    except InvalidRequest as exc:
        assert exc.field and exc.message
        assert "instance of" not in exc.message  # no private model class names in what callers read
    else:
        assert isinstance(chat, ChatRequest)
