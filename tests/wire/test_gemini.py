"""The Gemini codec, read back by the real google-genai SDK over an in-process transport.

§1 requests (SDK-built and Gemini CLI-shaped), §2 replies through ``generate_content``, §3 streams through
``generate_content_stream``, §4 errors, §5 junk bodies never raise anything but InvalidRequest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

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
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion, Usage
from polar.wire.gemini import CODEC, json_schema
from tests.wire.junk import junk_bodies

PROMPT_TOKENS = 987
WRITE = ToolCall("write_file", '{"file_path": "hello.txt", "content": "hi"}', id="call_w1")
SHELL = ToolCall("run_shell_command", '{"command": "ls"}', id="call_s2")
EVENTS: list[Event] = [
    ReasoningDelta("Need a "),
    ReasoningDelta("file."),
    TextDelta("Writing "),
    TextDelta("it."),
    ToolCallParsed(WRITE, 0),
    MalformedToolCall("<tool_call>oops", "unclosed"),
    ToolCallParsed(SHELL, 1),
]
META = StreamMeta(completion_id="gen-7", model="capture-model", created=1700000000, prompt_tokens=PROMPT_TOKENS)


def completion(**overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "id": "gen-7",
        "model": "capture-model",
        "created": 1700000000,
        "content": "Writing it.",
        "reasoning": "Need a file.",
        "tool_calls": (WRITE, SHELL),
        "finish_reason": FinishReason.STOP,
        "usage": Usage(PROMPT_TOKENS, 33),
    }
    return Completion(**(fields | overrides))


def sse_body(events: list[Event], done: Completion | None = None, error: PolarError | None = None) -> str:
    encoder = CODEC.stream_encoder(META)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    frames += encoder.error(error) if error is not None else encoder.finish(done or completion())
    return "".join(frames)


_PATH = re.compile(r"/v1beta/models/(?P<model>[^:/]+):(?P<method>generateContent|streamGenerateContent)$")


class Gateway:
    """A MockTransport handler: the codec parses each body (model and streaming from the URL) and answers."""

    def __init__(self, reply: Callable[[ChatRequest], httpx.Response] | None = None):
        self.requests: list[ChatRequest] = []
        self.queries: list[str] = []
        self._reply = reply

    def __call__(self, request: httpx.Request) -> httpx.Response:
        match = _PATH.search(request.url.path)
        assert match is not None, request.url
        self.queries.append(request.url.query.decode())
        stream = match["method"] == "streamGenerateContent"
        chat = CODEC.parse_request(json.loads(request.content), path_model=match["model"], path_stream=stream)
        self.requests.append(chat)
        if self._reply is not None:
            return self._reply(chat)
        if stream:
            return httpx.Response(200, text=sse_body(EVENTS), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=CODEC.response(completion()))

    def client(self) -> genai.Client:
        transport = httpx.MockTransport(self)
        options = types.HttpOptions(
            base_url="http://gateway.test",
            httpx_client=httpx.Client(transport=transport),
            httpx_async_client=httpx.AsyncClient(transport=transport),
        )
        return genai.Client(api_key="k", http_options=options)


CONFIG = types.GenerateContentConfig(
    system_instruction="You are Gemini CLI.",
    temperature=1.0,
    top_p=0.95,
    top_k=64,
    max_output_tokens=256,
    stop_sequences=["<END>"],
    seed=7,
    thinking_config=types.ThinkingConfig(include_thoughts=True),
    tools=[
        types.Tool(
            function_declarations=[
                types.FunctionDeclaration(
                    name="write_file",
                    description="Writes a file",
                    parameters_json_schema={"type": "object", "properties": {"file_path": {"type": "string"}}},
                ),
                types.FunctionDeclaration(
                    name="run_shell_command",
                    description="Runs a command",
                    parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")}),
                ),
            ]
        )
    ],
)
HISTORY = [
    types.Content(
        role="user", parts=[types.Part(text="<session_context>linux</session_context>"), types.Part(text="Go")]
    ),
    types.Content(
        role="model",
        parts=[
            types.Part(text="Plan", thought=True),
            types.Part(
                function_call=types.FunctionCall(
                    id="write_file_1764400000000_0", name="write_file", args={"content": "hi"}
                ),
                thought_signature=b"skip_thought_signature_validator",
            ),
        ],
    ),
    types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id="write_file_1764400000000_0", name="write_file", response={"output": "Successfully created"}
                )
            )
        ],
    ),
]


# §1 requests ----------------------------------------------------------------------------------------------


def test_sdk_request_becomes_the_canonical_request() -> None:
    gateway = Gateway()
    gateway.client().models.generate_content(model="capture-model", contents=HISTORY, config=CONFIG)
    (chat,) = gateway.requests
    assert chat.model == "capture-model" and chat.stream is False and chat.max_tokens == 256
    assert chat.sampling == {"temperature": 1.0, "top_p": 0.95, "top_k": 64, "stop": ["<END>"], "seed": 7}
    assert chat.messages == (
        Message(Role.SYSTEM, "You are Gemini CLI."),
        Message(Role.USER, "<session_context>linux</session_context>\nGo"),
        Message(
            Role.ASSISTANT,
            "",
            reasoning="Plan",
            tool_calls=(ToolCall("write_file", '{"content": "hi"}', id="write_file_1764400000000_0"),),
        ),
        Message(Role.TOOL, "Successfully created", tool_call_id="write_file_1764400000000_0", name="write_file"),
    )
    assert chat.tools == (
        ToolSpec("write_file", "Writes a file", {"type": "object", "properties": {"file_path": {"type": "string"}}}),
        ToolSpec(
            "run_shell_command", "Runs a command", {"type": "object", "properties": {"command": {"type": "string"}}}
        ),
    )


GEMINI_CLI_TURN_2: dict[str, Any] = {
    "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI, an autonomous CLI agent."}]},
    "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {"includeThoughts": True}},
    "tools": [
        {
            "functionDeclarations": [
                {
                    "name": "write_file",
                    "description": "Writes content to a file.",
                    "parametersJsonSchema": {
                        "type": "object",
                        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                        "required": ["file_path", "content"],
                    },
                }
            ]
        },
        {"googleSearch": {}},
    ],
    "contents": [
        {"role": "user", "parts": [{"text": "<session_context>Today is 2026-11-29.</session_context>"}]},
        {"role": "user", "parts": [{"text": "Create a file hello.txt containing hi"}]},
        {
            "role": "model",
            "parts": [
                {"text": "I will ", "thought": True},
                {"text": "write it.", "thought": True},
                {"text": "Creating "},
                {"text": "the file."},
                {
                    "functionCall": {
                        "id": "write_file_1764400000000_0",
                        "name": "write_file",
                        "args": {"file_path": "hello.txt", "content": "hi"},
                    },
                    "thoughtSignature": "skip_thought_signature_validator",
                },
                {"thoughtSignature": "c2ln"},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "write_file_1764400000000_0",
                        "name": "write_file",
                        "response": {"output": "Successfully created and wrote to new file: hello.txt"},
                    }
                },
                {"functionResponse": {"name": "read_file", "response": {"error": "not found", "code": 2}}},
            ],
        },
    ],
}


def test_gemini_cli_turn_two() -> None:
    chat = CODEC.parse_request(GEMINI_CLI_TURN_2, path_model="capture-model", path_stream=True)
    assert chat.stream is True and chat.max_tokens is None
    assert chat.sampling == {"temperature": 1, "top_p": 0.95, "top_k": 64}
    assert chat.messages == (
        Message(Role.SYSTEM, "You are Gemini CLI, an autonomous CLI agent."),
        Message(Role.USER, "<session_context>Today is 2026-11-29.</session_context>"),
        Message(Role.USER, "Create a file hello.txt containing hi"),
        Message(
            Role.ASSISTANT,
            "Creating the file.",  # streamed fragments are one text again
            reasoning="I will write it.",
            tool_calls=(
                ToolCall("write_file", '{"file_path": "hello.txt", "content": "hi"}', id="write_file_1764400000000_0"),
            ),
        ),
        Message(
            Role.TOOL,
            "Successfully created and wrote to new file: hello.txt",
            tool_call_id="write_file_1764400000000_0",
            name="write_file",
        ),
        Message(Role.TOOL, '{"error": "not found", "code": 2}', name="read_file"),
    )
    assert [tool.name for tool in chat.tools] == ["write_file"]  # googleSearch runs at Google


def test_snake_case_and_config_forms() -> None:
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],  # no role: a user turn
        "config": {
            "system_instruction": "Be brief.",
            "max_output_tokens": 9,
            "temperature": 0.2,
            "tools": [{"function_declarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
        },
    }
    chat = CODEC.parse_request(body, path_model="models/gemini-x")
    assert chat.model == "gemini-x" and chat.stream is False and chat.max_tokens == 9
    assert chat.messages == (Message(Role.SYSTEM, "Be brief."), Message(Role.USER, "hi"))
    assert chat.tools == (ToolSpec("f", "", {"type": "object"}),) and chat.sampling == {"temperature": 0.2}


def test_gemini_schema_types_become_json_schema() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["A", "B"]}},
            "when": {"anyOf": [{"type": "INTEGER"}, {"type": "NULL"}], "nullable": True},
            "type": {"type": "STRING", "description": "a property named type"},
        },
        "required": ["tags"],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["A", "B"]}},
            "when": {"anyOf": [{"type": "integer"}, {"type": "null"}], "nullable": True},
            "type": {"type": "string", "description": "a property named type"},
        },
        "required": ["tags"],
    }


def test_media_parts_become_placeholders() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, {"text": "see?"}]},
            {"role": "user", "parts": [{"fileData": {"mimeType": "application/pdf", "fileUri": "gs://x"}}]},
        ]
    }
    messages = CODEC.parse_request(body, path_model="m").messages
    assert messages == (
        Message(Role.USER, "[image omitted: this model cannot see images]\nsee?"),
        Message(Role.USER, "[file omitted: this model reads text only]"),
    )


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


# §5 bad input ---------------------------------------------------------------------------------------------

BASE: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "system", "parts": []}]}, "contents[0].role"),
        ({"contents": [{"role": "user"}]}, "contents[0].parts"),
        ({"contents": [{"parts": [{"text": 5}]}]}, "contents[0].parts[0].text"),
        ({"contents": [{"parts": [{"text": "a", "functionCall": {"name": "f"}}]}]}, "contents[0].parts[0]"),
        ({"contents": [{"parts": [{"functionCall": {"name": "f"}}]}]}, "contents[0].parts[0].functionCall"),
        (
            {"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "f"}}]}]},
            "contents[0].parts[0].functionResponse",
        ),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
            "contents[0].parts[0].functionCall.name",
        ),
        (
            {"contents": [{"role": "model", "parts": [{"function_call": {"name": "f", "args": []}}]}]},
            "contents[0].parts[0].function_call.args",
        ),
        ({**BASE, "generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount"),
        ({**BASE, "generationConfig": {"topK": 1.5}}, "generationConfig.topK"),
        ({**BASE, "generationConfig": {"maxOutputTokens": "9"}}, "generationConfig.maxOutputTokens"),
        ({**BASE, "config": {"candidateCount": 3}}, "config.candidateCount"),
        (
            {**BASE, "systemInstruction": {"parts": [{"functionCall": {"name": "f"}}]}},
            "systemInstruction.parts[0].functionCall",
        ),
        (
            {**BASE, "tools": [{"functionDeclarations": [{"description": "no name"}]}]},
            "tools[0].functionDeclarations[0].name",
        ),
    ],
)
def test_bad_requests_name_the_field(body: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(body, path_model="m")
    assert caught.value.field == field
    assert caught.value.message.startswith(field) or field == "body"


def test_a_model_is_required() -> None:
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(BASE)
    assert caught.value.field == "model"
    assert CODEC.parse_request({**BASE, "model": "from-body"}).model == "from-body"


@settings(max_examples=300, deadline=None)
@given(junk_bodies(GEMINI_CLI_TURN_2, max_edits=1), st.sampled_from([None, "capture-model"]))
def test_junk_raises_only_invalid_request(body: Any, path_model: str | None) -> None:
    try:
        chat = CODEC.parse_request(body, path_model=path_model, path_stream=True)
    except InvalidRequest as exc:
        assert exc.field and exc.message
        assert "instance of" not in exc.message  # no private model class names in what callers read
    else:
        assert isinstance(chat, ChatRequest)
