"""The Gemini codec decoding requests: built by the real google-genai SDK (over an in-process transport) and
shaped as Gemini CLI sends them, Gemini schema types, media parts; bad bodies name the field, and junk bodies
never raise anything but InvalidRequest. The SDK and the scripted gateway are tests/wire/gemini_sdk.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire.canonical import ChatRequest
from polar.wire.gemini import CODEC, json_schema
from tests.wire.gemini_sdk import CONFIG, Gateway
from tests.wire.junk import junk_bodies

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
