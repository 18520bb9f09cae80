"""The openai_chat codec encoding replies, parsed back by the official openai SDK (MockTransport, no network):
§2 JSON responses, §3 streams (``stream_encoder`` frames as SSE), §4 errors. The SDK harness is
tests/wire/openai_chat_sdk.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from polar.errors import BackendUnavailable, ContextLengthExceeded, InvalidRequest, StoreError
from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
from polar.tokens.parsers import TextDelta
from polar.wire.openai_chat import CODEC
from tests.wire.openai_chat_sdk import (
    BASH,
    META,
    TOOLS,
    VALID,
    WRITE,
    Harness,
    completion,
    sse_frames,
    sse_reply,
)


def chunks_of(frames: list[str]) -> list[dict[str, Any]]:
    return [json.loads(f.removeprefix("data: ")) for f in frames if f != "data: [DONE]\n\n"]


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
