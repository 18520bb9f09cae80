"""The openai_chat codec against the official openai SDK (MockTransport, no network).

The SDK builds the request; the handler runs it through ``parse_request`` and answers with ``response()``
or an SSE body from ``stream_encoder`` frames, which the SDK parses back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from polar.errors import (
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    StoreError,
)
from polar.inference import FinishReason
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.tokens.parsers import (
    MalformedToolCall,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)
from polar.wire.base import StreamMeta
from polar.wire.canonical import Completion, Usage
from polar.wire.openai_chat import CODEC, OpenAIChatRequest
from tests.wire.junk import junk_bodies

WRITE = ToolCall("write_file", '{"path": "hello.txt", "content": "hi"}', "call_write")
BASH = ToolCall("bash", '{"cmd":"ls -la"}', "call_bash")
EVENTS = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("a file."),
    TextDelta("I'll write "),
    TextDelta("it."),
    ToolCallParsed(WRITE, 0),
    MalformedToolCall("<tool_call>oops</tool_call>", "not JSON"),  # its text came as TextDelta already
    ToolCallParsed(BASH, 1),
]
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": SCHEMA}}]


def completion(
    content: str = "I'll write it.",
    reasoning: str | None = "The user wants a file.",
    calls: tuple[ToolCall, ...] = (WRITE, BASH),
    finish: FinishReason = FinishReason.STOP,
) -> Completion:
    return Completion("c0ffee", "tiny", 1700000000, content, reasoning, calls, finish, Usage(120, 17))


META = StreamMeta("c0ffee", "tiny", 1700000000, 120)


class Harness:
    """An SDK client whose transport is the codec: the last parsed request is kept for assertions."""

    def __init__(self, reply: Callable[[OpenAIChatRequest], httpx.Response]):
        self.reply = reply
        self.request: OpenAIChatRequest | None = None

    def handle(self, http: httpx.Request) -> httpx.Response:
        self.request = CODEC.parse_request(json.loads(http.content))
        return self.reply(self.request)

    def client(self) -> openai.OpenAI:
        transport = httpx.MockTransport(self.handle)
        return openai.OpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )

    def async_client(self) -> openai.AsyncOpenAI:
        async def handle(http: httpx.Request) -> httpx.Response:
            return self.handle(http)

        transport = httpx.MockTransport(handle)
        return openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )


def json_reply(done: Completion) -> Callable[[OpenAIChatRequest], httpx.Response]:
    return lambda request: httpx.Response(200, json=CODEC.response(done, request=request))


def sse_frames(done: Completion, request: OpenAIChatRequest | None, events=EVENTS) -> list[str]:
    encoder = CODEC.stream_encoder(META, request=request)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    return frames + encoder.finish(done)


def sse_reply(done: Completion, events=EVENTS) -> Callable[[OpenAIChatRequest], httpx.Response]:
    def reply(request: OpenAIChatRequest) -> httpx.Response:
        body = "".join(sse_frames(done, request, events))
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    return reply


def chunks_of(frames: list[str]) -> list[dict[str, Any]]:
    return [json.loads(f.removeprefix("data: ")) for f in frames if f != "data: [DONE]\n\n"]


# §1 requests ------------------------------------------------------------------------------------------------


def test_sdk_request_becomes_canonical_and_json_reply_parses():
    harness = Harness(json_reply(completion()))
    reply = harness.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "You are Pi."}, {"role": "user", "content": "Create hello.txt"}],
        tools=TOOLS,
        max_completion_tokens=16384,
        temperature=0.2,
        top_p=0.9,
        stop=["</done>"],
        seed=7,
        tool_choice="auto",
        parallel_tool_calls=True,
        store=False,
        extra_body={"top_k": 20},
    )
    request = harness.request
    assert request.messages == (Message(Role.SYSTEM, "You are Pi."), Message(Role.USER, "Create hello.txt"))
    assert request.tools == (ToolSpec("write_file", "Write a file", SCHEMA),)
    assert request.max_tokens == 16384 and request.stream is False
    assert request.sampling == {"temperature": 0.2, "top_p": 0.9, "top_k": 20, "seed": 7, "stop": ("</done>",)}

    choice = reply.choices[0]
    assert reply.id == "chatcmpl-c0ffee" and reply.object == "chat.completion" and reply.model == "tiny"
    assert choice.finish_reason == "tool_calls" and choice.message.role == "assistant"
    assert choice.message.content == "I'll write it."
    assert choice.message.reasoning_content == "The user wants a file."  # an extra field the SDK keeps
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("call_write", "function", "write_file", WRITE.arguments),
        ("call_bash", "function", "bash", BASH.arguments),
    ]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (120, 17, 137)


def test_qwen_code_shaped_request():
    """Qwen Code: text-part arrays on user and tool messages, content null beside tool_calls, usage asked."""
    body = {
        "model": "capture-model",
        "messages": [
            {"role": "system", "content": "You are Qwen Code."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "This is the Qwen Code. We are setting up the context."}],
            },
            {"role": "assistant", "content": "Got it. Thanks for the context!"},
            {"role": "user", "content": [{"type": "text", "text": "Create a file hello.txt containing hi"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Use write_file.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "write_file", "arguments": '{"file_path":"hello.txt","content":"hi"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [{"type": "text", "text": "Successfully created hello.txt"}],
            },
        ],
        "tools": TOOLS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8000,
    }
    request = CODEC.parse_request(body)
    assert request.messages == (
        Message(Role.SYSTEM, "You are Qwen Code."),
        Message(Role.USER, "This is the Qwen Code. We are setting up the context."),
        Message(Role.ASSISTANT, "Got it. Thanks for the context!"),
        Message(Role.USER, "Create a file hello.txt containing hi"),
        Message(
            Role.ASSISTANT,
            "",
            reasoning="Use write_file.",
            tool_calls=(ToolCall("write_file", '{"file_path":"hello.txt","content":"hi"}', "call_1"),),
        ),
        Message(Role.TOOL, "Successfully created hello.txt", tool_call_id="call_1"),
    )
    assert request.stream and request.include_usage and request.max_tokens == 8000


def test_opencode_and_odd_shapes():
    """OpenCode's empty content beside calls; developer and mid-list system messages stay in place; the
    legacy function role; vLLM's ``reasoning``; images become a placeholder; non-function tools skipped."""
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
            },
            {
                "role": "assistant",
                "content": "",
                "reasoning": "think",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "Wrote file successfully."},
            {"role": "system", "content": "A reminder in the middle."},
            {"role": "function", "name": "f", "content": "legacy"},
        ],
        "tools": [*TOOLS, {"type": "custom", "custom": {"name": "apply_patch"}}, {"type": "web_search"}],
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "metadata": {"a": "b"},
        "user": "u",
        "logprobs": True,
    }
    request = CODEC.parse_request(body)
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool", "system", "tool"]
    assert request.messages[1].content == "look\n[image omitted: this model cannot see images]"
    assert request.messages[2] == Message(Role.ASSISTANT, "", reasoning="think", tool_calls=(ToolCall("f", "{}", "c"),))
    assert request.messages[4].content == "A reminder in the middle."
    assert request.messages[5] == Message(Role.TOOL, "legacy", name="f")
    assert [t.name for t in request.tools] == ["write_file"]
    assert request.include_usage is False and request.sampling == {}


BAD = [
    ({"model": "m", "messages": "hello"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    (
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
                },
            ],
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
    ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "a lot"}, "max_tokens"),
    (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
        "max_completion_tokens",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", 3]}, "stop[1]"),
    ({"model": "m", "messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        "messages[0].content[0].text",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        "tools[0].function",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    (["not", "an", "object"], "body"),
    (None, "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field
    assert caught.value.message.startswith(field)


VALID = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "u"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ],
    "tools": TOOLS,
    "stop": ["x"],
    "stream_options": {"include_usage": True},
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_junk_bodies_raise_only_invalid_request(body):
    try:
        request = CODEC.parse_request(body)
    except InvalidRequest as exc:
        assert exc.field and exc.message
    else:
        assert isinstance(request, OpenAIChatRequest) and request.messages


# §2 responses -----------------------------------------------------------------------------------------------


def test_content_is_null_beside_calls_and_empty_without():
    calls_only = CODEC.response(completion(content="", reasoning=None))
    message = calls_only["choices"][0]["message"]
    assert message["content"] is None and "reasoning_content" not in message
    nothing = CODEC.response(completion(content="", reasoning=None, calls=()))
    assert nothing["choices"][0]["message"]["content"] == "" and "tool_calls" not in nothing["choices"][0]["message"]
    ChatCompletion.model_validate(calls_only)
    assert set(calls_only) == {"id", "object", "created", "model", "choices", "usage"}  # no token ids, no logprobs
    assert set(calls_only["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert calls_only["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("finish", "calls", "expected"),
    [
        (FinishReason.STOP, (), "stop"),
        (FinishReason.STOP, (WRITE,), "tool_calls"),
        (FinishReason.LENGTH, (), "length"),
        (FinishReason.LENGTH, (WRITE,), "length"),
        (FinishReason.ABORT, (), "length"),
    ],
)
def test_finish_reasons(finish, calls, expected):
    body = CODEC.response(completion(calls=calls, finish=finish))
    assert body["choices"][0]["finish_reason"] == expected
    frames = sse_frames(completion(calls=calls, finish=finish), None, events=[])
    assert [c["choices"][0]["finish_reason"] for c in chunks_of(frames) if c["choices"]][-1] == expected


def test_calls_without_ids_get_stable_ids():
    done = completion(calls=(ToolCall("f", "{}"), ToolCall("g", "{}")))
    ids = [c["id"] for c in CODEC.response(done)["choices"][0]["message"]["tool_calls"]]
    streamed = [
        tc["id"]
        for c in chunks_of(sse_frames(done, None, events=[]))
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert ids == streamed == ["call_c0ffee_0", "call_c0ffee_1"]


# §3 streams -------------------------------------------------------------------------------------------------


def _collect(chunks) -> dict[str, Any]:
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": [], "finish": None, "usage": None, "roles": []}
    for chunk in chunks:
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            out["roles"] += [delta.role] if delta.role else []
            out["content"] += delta.content or ""
            out["reasoning"] += getattr(delta, "reasoning_content", None) or ""
            out["calls"] += delta.tool_calls or []
            out["finish"] = choice.finish_reason or out["finish"]
    return out


def test_stream_through_the_sdk_with_usage():
    harness = Harness(sse_reply(completion()))
    stream = harness.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    got = _collect(chunks)
    assert got["roles"] == ["assistant"]
    assert got["content"] == "I'll write it." and got["reasoning"] == "The user wants a file."
    assert [(c.index, c.id, c.type, c.function.name, c.function.arguments) for c in got["calls"]] == [
        (0, "call_write", "function", "write_file", WRITE.arguments),
        (1, "call_bash", "function", "bash", BASH.arguments),
    ]
    assert got["finish"] == "tool_calls"
    assert chunks[-1].choices == [] and got["usage"].total_tokens == 137
    assert all(c.id == "chatcmpl-c0ffee" and c.object == "chat.completion.chunk" for c in chunks)


def test_stream_without_include_usage_has_no_usage_chunk():
    harness = Harness(sse_reply(completion(reasoning=None, calls=()), events=[TextDelta("I'll write it.")]))
    chunks = list(
        harness.client().chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}], stream=True)
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    assert _collect(chunks)["finish"] == "stop"


async def test_async_stream_through_the_sdk():
    harness = Harness(sse_reply(completion()))
    stream = await harness.async_client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], stream=True, stream_options={"include_usage": True}
    )
    got = _collect([chunk async for chunk in stream])
    assert got["content"] == "I'll write it." and len(got["calls"]) == 2 and got["usage"].prompt_tokens == 120


def test_frames_validate_and_finish_alone_sends_everything():
    """Driven by start + finish only, the encoder still streams the reasoning, text and calls."""
    frames = sse_frames(completion(), CODEC.parse_request({**VALID, "stream": True}), events=[])
    assert frames[-1] == "data: [DONE]\n\n"
    chunks = [ChatCompletionChunk.model_validate(c) for c in chunks_of(frames)]
    got = _collect(chunks)
    assert got["content"] == "I'll write it." and got["reasoning"] == "The user wants a file."
    assert [c.id for c in got["calls"]] == ["call_write", "call_bash"] and got["usage"].completion_tokens == 17


def test_error_mid_stream_raises_api_error_in_the_sdk():
    def reply(request):
        encoder = CODEC.stream_encoder(META, request=request)
        frames = encoder.start() + encoder.on_event(TextDelta("partial")) + encoder.error(BackendUnavailable("down"))
        return httpx.Response(200, content="".join(frames).encode(), headers={"content-type": "text/event-stream"})

    stream = (
        Harness(reply)
        .client()
        .chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}], stream=True)
    )
    seen = []
    with pytest.raises(openai.APIError, match="down") as caught:
        seen.extend(stream)
    assert seen and caught.value.body["code"] == "backend_unavailable"


# §4 errors --------------------------------------------------------------------------------------------------


def test_context_length_error_is_the_shape_litellm_compacts_on():
    status, body = CODEC.error_response(ContextLengthExceeded(9000, 8192))
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "messages"

    harness = Harness(lambda request: httpx.Response(status, json=body))
    with pytest.raises(openai.BadRequestError) as caught:
        harness.client().chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "context_length_exceeded" and "8192" in caught.value.message


def test_store_and_request_errors():
    status, body = CODEC.error_response(StoreError("database is down"))
    assert status == 503
    assert body == {
        "error": {"message": "database is down", "type": "server_error", "param": None, "code": "store_unavailable"}
    }
    harness = Harness(lambda request: httpx.Response(status, json=body))
    with pytest.raises(openai.InternalServerError, match="database is down"):
        harness.client().chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}])

    status, body = CODEC.error_response(InvalidRequest("messages[0].role: bad", field="messages[0].role"))
    assert status == 400 and body["error"]["param"] == "messages[0].role"
    assert body["error"]["type"] == "invalid_request_error"
