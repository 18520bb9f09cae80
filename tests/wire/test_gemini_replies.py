"""The Gemini codec encoding replies, read back by the real google-genai SDK over an in-process transport:
§2 replies through ``generate_content``, §3 streams through ``generate_content_stream``, §4 errors. The SDK
and the scripted gateway are tests/wire/gemini_sdk.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from google.genai import errors as genai_errors
from google.genai import types

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
from polar.tokens.parsers import TextDelta
from polar.wire.gemini import CODEC
from tests.wire.gemini_sdk import CONFIG, EVENTS, PROMPT_TOKENS, WRITE, Gateway, completion, sse_body

# §2 replies -----------------------------------------------------------------------------------------------


def test_generate_content_reads_the_reply() -> None:
    response = Gateway().client().models.generate_content(model="capture-model", contents="Go", config=CONFIG)
    assert response.text == "Writing it."
    assert [(c.id, c.name, c.args) for c in response.function_calls or []] == [
        ("call_w1", "write_file", {"file_path": "hello.txt", "content": "hi"}),
        ("call_s2", "run_shell_command", {"command": "ls"}),
    ]
    candidate = (response.candidates or [])[0]
    parts = candidate.content.parts if candidate.content else None
    assert parts is not None and (parts[0].thought, parts[0].text) == (True, "Need a file.")
    assert candidate.finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert usage is not None and (usage.prompt_token_count, usage.candidates_token_count) == (PROMPT_TOKENS, 33)
    assert usage.total_token_count == PROMPT_TOKENS + 33
    assert response.model_version == "capture-model" and response.response_id == "gen-7"


@pytest.mark.parametrize(
    ("finish", "expected"),
    [(FinishReason.STOP, "STOP"), (FinishReason.LENGTH, "MAX_TOKENS"), (FinishReason.ABORT, "OTHER")],
)
def test_finish_reasons(finish: FinishReason, expected: str) -> None:
    response = types.GenerateContentResponse.model_validate(CODEC.response(completion(finish_reason=finish)))
    assert (response.candidates or [])[0].finish_reason == types.FinishReason(expected)


def test_an_empty_reply_validates() -> None:
    body = CODEC.response(completion(content="", reasoning=None, tool_calls=()))
    response = types.GenerateContentResponse.model_validate(body)
    assert response.text is None and response.function_calls is None


# §3 streams -----------------------------------------------------------------------------------------------


def test_generate_content_stream() -> None:
    gateway = Gateway()
    chunks = list(gateway.client().models.generate_content_stream(model="capture-model", contents="Go", config=CONFIG))
    assert gateway.requests[0].stream is True and gateway.queries == ["alt=sse"]
    parts = [part for chunk in chunks[:-1] for part in chunk.candidates[0].content.parts]  # type: ignore[index, union-attr]
    assert [(p.text, bool(p.thought)) for p in parts if p.text] == [
        ("Need a ", True),
        ("file.", True),
        ("Writing ", False),
        ("it.", False),
    ]
    assert "".join(chunk.text or "" for chunk in chunks) == "Writing it."
    calls = [call for chunk in chunks for call in chunk.function_calls or []]
    assert [(c.name, c.args) for c in calls] == [
        ("write_file", json.loads(WRITE.arguments)),
        ("run_shell_command", {"command": "ls"}),
    ]
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]
    assert last.usage_metadata is not None and last.usage_metadata.prompt_token_count == PROMPT_TOKENS
    assert last.usage_metadata.candidates_token_count == 33
    assert all(chunk.candidates[0].finish_reason is None for chunk in chunks[:-1])  # type: ignore[index]


async def test_async_generate_content_stream() -> None:
    client = Gateway().client()
    chunks = [
        chunk async for chunk in await client.aio.models.generate_content_stream(model="capture-model", contents="Go")
    ]
    assert "".join(chunk.text or "" for chunk in chunks) == "Writing it."
    assert len([call for chunk in chunks for call in chunk.function_calls or []]) == 2
    assert chunks[-1].usage_metadata is not None and chunks[-1].usage_metadata.total_token_count == PROMPT_TOKENS + 33


def test_stream_frames_have_no_event_names_and_no_done() -> None:
    body = sse_body(EVENTS)
    frames = [frame for frame in body.split("\n\n") if frame]
    assert all(frame.startswith("data: {") and "\n" not in frame for frame in frames)
    assert "[DONE]" not in body and len(frames) == 7  # 6 events with output, 1 final chunk


def test_error_mid_stream_raises_in_the_sdk() -> None:
    body = sse_body([TextDelta("partial")], error=BackendUnavailable("backend went away"))
    gateway = Gateway(lambda _: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    with pytest.raises(genai_errors.ServerError) as caught:
        list(gateway.client().models.generate_content_stream(model="capture-model", contents="Go"))
    assert caught.value.code == 503 and caught.value.status == "UNAVAILABLE"
    assert caught.value.message == "backend went away"


# §4 errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "name"),
    [
        (InvalidRequest("contents: bad", field="contents"), 400, "INVALID_ARGUMENT"),
        (StoreError("database is down"), 503, "UNAVAILABLE"),
        (BackendUnavailable("connection refused"), 503, "UNAVAILABLE"),
        (AuthenticationError("no such key"), 401, "UNAUTHENTICATED"),
        (PermissionDenied("session closed"), 403, "PERMISSION_DENIED"),
        (NotFound("no such session"), 404, "NOT_FOUND"),
        (PolarError("boom"), 500, "INTERNAL"),
    ],
)
def test_error_response_shapes(error: PolarError, status: int, name: str) -> None:
    assert CODEC.error_response(error) == (
        status,
        {"error": {"code": status, "message": error.message, "status": name}},
    )


def test_context_length_error_in_gemini_words() -> None:
    status, body = CODEC.error_response(ContextLengthExceeded(1_100_000, 1_048_576))
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    expected = "The input token count (1100000) exceeds the maximum number of tokens allowed (1048576)."
    assert body["error"]["message"] == expected
    gateway = Gateway(lambda _: httpx.Response(status, json=body))
    with pytest.raises(genai_errors.ClientError) as caught:
        gateway.client().models.generate_content(model="capture-model", contents="Go")
    assert caught.value.code == 400 and caught.value.message == expected
