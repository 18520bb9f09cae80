"""The Anthropic Messages codec encoding replies, read back by the real anthropic SDK over an in-process
transport: §2 replies through ``messages.create``, §3 streams through ``create(stream=True)`` and
``messages.stream()``, §4 errors. The SDK and the scripted gateway are tests/wire/anthropic_sdk.py.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

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
from polar.tokens.parsers import Event, ReasoningDelta, TextDelta
from polar.wire.anthropic import CODEC, count_tokens_response, thinking_signature
from tests.wire.anthropic_sdk import CREATE_ARGS, PROMPT_TOKENS, WRITE, Gateway, completion, sse_body

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
