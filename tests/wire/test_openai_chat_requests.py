"""The openai_chat codec decoding requests: built by the official openai SDK (MockTransport, no network) and
shaped as Qwen Code and OpenCode send them; bad bodies name the field, and junk bodies never raise anything
but InvalidRequest. The SDK harness is tests/wire/openai_chat_sdk.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from polar.errors import InvalidRequest
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire.openai_chat import CODEC, OpenAIChatRequest
from tests.wire.junk import junk_bodies
from tests.wire.openai_chat_sdk import BASH, SCHEMA, TOOLS, VALID, WRITE, Harness, completion, json_reply

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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_junk_bodies_raise_only_invalid_request(body):
    try:
        request = CODEC.parse_request(body)
    except InvalidRequest as exc:
        assert exc.field and exc.message
    else:
        assert isinstance(request, OpenAIChatRequest) and request.messages
