"""The openai_responses codec decoding requests: built by the official openai SDK (MockTransport, no network)
and shaped as Codex, OpenCode and Pi send them (docs/harnesses.md), input items grouped into replies; bad
bodies name the field, and junk bodies never raise anything but InvalidRequest. The SDK harness and Codex's
tools are tests/wire/openai_responses_sdk.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from polar.errors import InvalidRequest
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.wire.openai_responses import CODEC, OpenAIResponsesRequest
from polar.wire.openai_responses_output import encode_reasoning
from tests.wire.junk import junk_bodies
from tests.wire.openai_responses_sdk import (
    APPLY,
    CMD_SCHEMA,
    CODEX_TOOLS,
    EXEC,
    GRAMMAR,
    PATCH,
    REASONING,
    SPAWN,
    Harness,
    assert_codex_output,
    completion,
    sse_reply,
)

# §1 requests ------------------------------------------------------------------------------------------------


def test_sdk_request_and_json_reply():
    harness = Harness(lambda request: httpx.Response(200, json=CODEC.response(completion(), request=request)))
    reply = harness.client().responses.create(
        model="gpt-test",
        instructions="Be brief.",
        input="Create hello.txt",
        tools=CODEX_TOOLS,
        max_output_tokens=16384,
        temperature=0.3,
        top_p=0.95,
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "low"},
        prompt_cache_key="k",
        parallel_tool_calls=False,
        tool_choice="auto",
        metadata={"a": "b"},
    )
    request = harness.request
    assert request.messages == (Message(Role.SYSTEM, "Be brief."), Message(Role.USER, "Create hello.txt"))
    assert request.max_tokens == 16384 and request.sampling == {"temperature": 0.3, "top_p": 0.95}
    names = [t.name for t in request.tools]
    assert names == ["exec_command", "apply_patch", "multi_agent_v1.spawn_agent", "multi_agent_v1.wait_agent"]
    assert request.tools[0] == ToolSpec("exec_command", "Runs a command.", CMD_SCHEMA)
    patch = request.tools[1].parameters
    assert patch["required"] == ["input"] and patch["properties"]["input"]["type"] == "string"
    assert GRAMMAR in patch["properties"]["input"]["description"]
    assert "Sub-agents." in request.tools[2].description
    assert_codex_output(reply)


def test_codex_turn_two_shape():
    """Developer prompt, environment context, our reasoning item, function_call + string output, a custom
    apply_patch call + input_text-array output, and a foreign reasoning item with only a summary."""
    body = {
        "model": "capture-model",
        "stream": True,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "pck",
        "client_metadata": {"x": "y"},
        "tools": CODEX_TOOLS,
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Create hello.txt"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "short"}],
                "encrypted_content": encode_reasoning("exact thought"),
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "exec_command",
                "arguments": '{"cmd":"ls"}',
            },
            {
                "type": "function_call_output",
                "id": "fco_1",
                "call_id": "c1",
                "output": "Chunk ID: 1\nProcess exited with code 0\nOutput:\n",
            },
            {
                "type": "reasoning",
                "id": "rs_2",
                "summary": [{"type": "summary_text", "text": "Now patch."}],
                "encrypted_content": "gAAAAB-opaque",
            },
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "status": "completed",
                "call_id": "c2",
                "name": "apply_patch",
                "input": PATCH,
            },
            {
                "type": "custom_tool_call_output",
                "call_id": "c2",
                "output": [
                    {"type": "input_text", "text": "Script completed"},
                    {"type": "input_text", "text": "exit 0"},
                ],
            },
        ],
    }
    request = CODEC.parse_request(body)
    assert request.messages == (
        Message(Role.SYSTEM, "You are a coding agent."),
        Message(Role.USER, "<environment_context/>"),
        Message(Role.USER, "Create hello.txt"),
        Message(
            Role.ASSISTANT, "", reasoning="exact thought", tool_calls=(ToolCall("exec_command", '{"cmd":"ls"}', "c1"),)
        ),
        Message(
            Role.TOOL, "Chunk ID: 1\nProcess exited with code 0\nOutput:\n", tool_call_id="c1", name="exec_command"
        ),
        Message(
            Role.ASSISTANT,
            "",
            reasoning="Now patch.",
            tool_calls=(ToolCall("apply_patch", json.dumps({"input": PATCH}), "c2"),),
        ),
        Message(Role.TOOL, "Script completed\nexit 0", tool_call_id="c2", name="apply_patch"),
    )
    assert request.stream and request.routes["apply_patch"].kind == "custom"


def test_additional_tools_item_and_catalogued_codex_shape():
    body = {
        "model": "gpt-6.1-sol",
        "input": [
            {
                "type": "additional_tools",
                "role": "developer",
                "tools": [
                    {
                        "type": "namespace",
                        "name": "functions",
                        "description": "",
                        "tools": [
                            {
                                "type": "custom",
                                "name": "exec",
                                "description": "Run JS.",
                                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                            },
                            {"type": "function", "name": "wait", "parameters": {"type": "object"}},
                        ],
                    },
                    {
                        "type": "namespace",
                        "name": "clock",
                        "description": "Time.",
                        "tools": [{"type": "function", "name": "sleep"}],
                    },
                ],
            },
            {"role": "developer", "content": "prompt"},
            {"role": "user", "content": "go"},
        ],
        "text": {"verbosity": "low"},
    }
    request = CODEC.parse_request(body)
    assert [t.name for t in request.tools] == ["functions.exec", "functions.wait", "clock.sleep"]
    assert request.messages == (Message(Role.SYSTEM, "prompt"), Message(Role.USER, "go"))
    out = CODEC.response(
        completion(calls=(ToolCall("functions.exec", '{"input": "await tools.x()"}', "e1"),)), request=request
    )
    call = out["output"][-1]
    assert (call["type"], call["name"], call["namespace"], call["input"]) == (
        "custom_tool_call",
        "exec",
        "functions",
        "await tools.x()",
    )


def test_reply_items_echoed_back_regroup_into_one_assistant_message():
    """Codex appends the model's items verbatim: reasoning, message and three calls come back as one reply."""
    first = (
        Harness(sse_reply(completion()))
        .client()
        .responses.create(model="gpt-test", input="Create hello.txt", tools=CODEX_TOOLS, stream=True)
    )
    final = next(e for e in first if e.type == "response.completed").response
    items = [{"role": "user", "content": "Create hello.txt"}, *(o.model_dump(exclude_none=True) for o in final.output)]
    items += [
        {"type": "function_call_output", "call_id": "call_exec", "output": "ok"},
        {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Done!"},
        {
            "type": "function_call_output",
            "call_id": "call_spawn",
            "output": [{"type": "input_text", "text": "spawned"}],
        },
    ]
    request = CODEC.parse_request({"model": "gpt-test", "input": items, "tools": CODEX_TOOLS})
    user, reply, *results = request.messages
    assert user == Message(Role.USER, "Create hello.txt")
    assert (reply.role, reply.content, reply.reasoning) == (Role.ASSISTANT, "Creating the file.", REASONING)
    assert [(c.id, c.name, c.parsed_arguments()) for c in reply.tool_calls] == [
        (c.id, c.name, c.parsed_arguments()) for c in (EXEC, APPLY, SPAWN)
    ]
    assert [(m.role, m.tool_call_id, m.name, m.content) for m in results] == [
        (Role.TOOL, "call_exec", "exec_command", "ok"),
        (Role.TOOL, "call_patch", "apply_patch", "Done!"),
        (Role.TOOL, "call_spawn", "multi_agent_v1.spawn_agent", "spawned"),
    ]


def test_grouping_of_items_into_replies():
    item = {"type": "function_call", "name": "f", "arguments": "{}"}
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "u"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r1"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "t1"}]},
            {**item, "call_id": "a"},
            {**item, "call_id": "b"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {
                "type": "function_call_output",
                "call_id": "b",
                "output": [{"type": "input_image", "image_url": "data:,"}],
            },
            {"role": "assistant", "content": "t2"},
            {"role": "assistant", "content": "t3"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only thinking"}]},
            {
                "type": "local_shell_call",
                "call_id": "s",
                "status": "completed",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
            },
            {"type": "local_shell_call_output", "id": "s", "output": "files"},
            {"type": "shell_call", "call_id": "t", "action": {"commands": ["pwd"]}},
            {
                "type": "shell_call_output",
                "call_id": "t",
                "output": [{"stdout": "/", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
            },
        ],
    }
    m = CODEC.parse_request(body).messages
    assert m[1] == Message(
        Role.ASSISTANT, "t1", reasoning="r1", tool_calls=(ToolCall("f", "{}", "a"), ToolCall("f", "{}", "b"))
    )
    assert m[3].content == "[image omitted: this model cannot see images]"
    assert (m[4].content, m[5].content) == ("t2", "t3")  # two text messages: two replies
    assert m[6] == Message(
        Role.ASSISTANT,
        "",
        reasoning="only thinking",
        tool_calls=(ToolCall("local_shell", json.dumps({"type": "exec", "command": ["ls"], "env": {}}), "s"),),
    )
    assert m[7] == Message(Role.TOOL, "files", tool_call_id="s", name="local_shell")
    assert m[8].tool_calls[0].name == "shell" and json.loads(m[9].content)[0]["stdout"] == "/"
    assert len(m) == 10


BAD = [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": 5}, "input"),
    ({"model": "m", "input": [5]}, "input[0]"),
    ({"model": "m", "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    (
        {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
        "input[0].arguments",
    ),
    (
        {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]}]},
        "input[0].output[0].text",
    ),
    (
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input[0].content[0].type",
    ),
    ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"model": "m", "input": [{"type": "compaction", "encrypted_content": "x"}]}, "input[0].type"),
    ({"model": "m", "input": [{"type": 3}]}, "input[0].type"),
    (
        {"model": "m", "input": [{"type": "reasoning", "summary": [], "encrypted_content": "polar:%%%"}]},
        "input[0].encrypted_content",
    ),
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": "x", "max_output_tokens": "lots"}, "max_output_tokens"),
    ({"model": "m", "input": "x", "tools": ["x"]}, "tools[0]"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    (
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "function", "name": 3}]}],
        },
        "tools[0].tools[0].name",
    ),
    ({"model": "m", "input": "x", "tools": [{"type": "custom", "name": "c", "format": "lark"}]}, "tools[0].format"),
    ("junk", "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(InvalidRequest) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field and caught.value.message.startswith(field)


VALID = {
    "model": "m",
    "instructions": "i",
    "input": [
        {"role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": encode_reasoning("r"),
        },
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "o"}]},
        {"type": "custom_tool_call", "call_id": "d", "name": "apply_patch", "input": "p"},
        {"type": "custom_tool_call_output", "call_id": "d", "output": "ok"},
        {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "g"}]},
    ],
    "tools": CODEX_TOOLS,
    "max_output_tokens": 5,
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_bodies(VALID))
def test_junk_bodies_raise_only_invalid_request(body):
    try:
        request = CODEC.parse_request(body)
    except InvalidRequest as exc:
        assert exc.field and exc.message
    else:
        assert isinstance(request, OpenAIResponsesRequest)
