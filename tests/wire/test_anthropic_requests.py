"""The Anthropic Messages codec decoding requests: built by the real anthropic SDK (over an in-process transport)
and shaped as Claude Code sends them; bad bodies name the field, and junk bodies never raise anything but
InvalidRequest. The SDK and the scripted gateway are tests/wire/anthropic_sdk.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from polar.errors import InvalidRequest
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire.anthropic import CODEC
from polar.wire.canonical import ChatRequest
from tests.wire.anthropic_sdk import CREATE_ARGS, TOOLS, Gateway
from tests.wire.junk import junk_bodies

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
