"""The openai_responses codec encoding replies, parsed back by the official openai SDK (MockTransport, no
network) through ``responses.create`` (JSON and ``stream=True``) and the ``responses.stream()`` helper:
§1 the JSON response, §2 streams (every event validated against the SDK's models), §3 errors. The SDK
harness is tests/wire/openai_responses_sdk.py.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from polar.errors import ContextLengthExceeded, StoreError
from polar.inference import FinishReason
from polar.tokens.parsers import TextDelta
from polar.wire.openai_responses import CODEC
from tests.wire.openai_responses_sdk import (
    CODEX_TOOLS,
    META,
    REASONING,
    Harness,
    assert_codex_output,
    codex_request,
    completion,
    frames_for,
    sse_reply,
)

EVENT_MODELS = {
    typing.get_args(m.model_fields["type"].annotation)[0]: m
    for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def decoded(frames: list[str]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        event_line, data_line = frame.strip("\n").split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        out.append(data)
    return out


# §1 responses -----------------------------------------------------------------------------------------------


def test_direct_response_validates_against_the_sdk_model():
    body = CODEC.response(completion(), request=codex_request())
    assert_codex_output(Response.model_validate(body))
    assert not {"output_ids", "prompt_ids", "token_ids", "logprobs"} & set(body)  # nothing for training leaks
    assert all(part["logprobs"] == [] for item in body["output"] for part in item.get("content", []))
    plain = CODEC.response(completion())  # without the request every call is a plain function_call
    assert [o["type"] for o in plain["output"]][2:] == ["function_call"] * 3
    assert plain["output"][4]["name"] == "multi_agent_v1.spawn_agent"


# §2 streams -------------------------------------------------------------------------------------------------


def test_event_sequence_is_complete_and_every_event_validates():
    events = decoded(frames_for(completion(), codex_request()))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        EVENT_MODELS[event["type"]].model_validate(event)
    added, done = "response.output_item.added", "response.output_item.done"
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        added,
        "response.reasoning_summary_part.added",
        *["response.reasoning_summary_text.delta"] * 2,
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        done,
        added,
        "response.content_part.added",
        *["response.output_text.delta"] * 2,
        "response.output_text.done",
        "response.content_part.done",
        done,
        added,
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        done,
        added,
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        done,
        added,
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        done,
        "response.completed",
    ]
    final = events[-1]["response"]
    assert final == CODEC.response(completion(), request=codex_request())  # the stream and the record agree
    assert [e["output_index"] for e in events if e["type"] == done] == [0, 1, 2, 3, 4]


def test_create_stream_true_through_the_sdk():
    harness = Harness(sse_reply(completion()))
    stream = harness.client().responses.create(model="gpt-test", input="go", tools=CODEX_TOOLS, stream=True)
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert text == "Creating the file." and thought == REASONING
    assert_codex_output(events[-1].response)


def test_stream_helper_and_final_response():
    harness = Harness(sse_reply(completion()))
    with harness.client().responses.stream(model="gpt-test", input="go", tools=CODEX_TOOLS) as stream:
        snapshots = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert snapshots == ["Creating ", "Creating the file."]
    assert_codex_output(final)


async def test_async_stream_helper():
    harness = Harness(sse_reply(completion(reasoning=None, calls=()), events=[TextDelta("Done.")]))
    async with harness.async_client().responses.stream(model="gpt-test", input="go") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "Done." and [o.type for o in final.output] == ["message"]


def test_finish_alone_streams_the_whole_completion():
    events = decoded(frames_for(completion(), codex_request(), events=[]))
    assert events[-1]["response"] == CODEC.response(completion(), request=codex_request())
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Creating the file."


@pytest.mark.parametrize("finish", [FinishReason.LENGTH, FinishReason.ABORT])
def test_cut_short_replies_are_incomplete(finish):
    done = completion(calls=(), finish=finish)
    body = Response.model_validate(CODEC.response(done))
    assert body.status == "incomplete" and body.incomplete_details.reason == "max_output_tokens"
    harness = Harness(sse_reply(done, events=[TextDelta("Creating the")]))
    events = list(harness.client().responses.create(model="t", input="go", stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-1].response.output_text == "Creating the file."


def test_error_mid_stream():
    def reply(request):
        encoder = CODEC.stream_encoder(META, request=request)
        frames = (
            encoder.start() + encoder.on_event(TextDelta("part")) + encoder.error(ContextLengthExceeded(9000, 8192))
        )
        return httpx.Response(200, content="".join(frames).encode(), headers={"content-type": "text/event-stream"})

    events = list(Harness(reply).client().responses.create(model="t", input="go", stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-2].code == "context_length_exceeded" and "8192" in events[-2].message
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "context_length_exceeded"


# §3 errors --------------------------------------------------------------------------------------------------


def test_error_bodies():
    status, body = CODEC.error_response(ContextLengthExceeded(9000, 8192))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "input"
    harness = Harness(lambda request: httpx.Response(status, json=body))
    with pytest.raises(openai.BadRequestError) as caught:
        harness.client().responses.create(model="t", input="go")
    assert caught.value.code == "context_length_exceeded"

    status, body = CODEC.error_response(StoreError("database is down"))
    assert status == 503 and body["error"]["type"] == "server_error" and body["error"]["code"] == "store_unavailable"
    harness = Harness(lambda request: httpx.Response(status, json=body))
    with pytest.raises(openai.InternalServerError, match="database is down"):
        harness.client().responses.create(model="t", input="go")
