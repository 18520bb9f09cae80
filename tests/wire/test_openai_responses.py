"""The openai_responses codec against the official openai SDK (MockTransport, no network).

Request shapes follow what Codex, OpenCode and Pi send (docs/harnesses.md); replies
are parsed by ``responses.create`` (JSON and ``stream=True``) and the ``responses.stream()`` helper.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from openai.types.responses import Response, ResponseStreamEvent

from polar.errors import ContextLengthExceeded, InvalidRequest, StoreError
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
from polar.wire.openai_responses import CODEC, OpenAIResponsesRequest
from polar.wire.openai_responses_output import encode_reasoning
from tests.wire.junk import junk_bodies

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch"
EXEC = ToolCall("exec_command", '{"cmd": "ls"}', "call_exec")
APPLY = ToolCall("apply_patch", json.dumps({"input": PATCH}), "call_patch")
SPAWN = ToolCall("multi_agent_v1.spawn_agent", '{"task":"review"}', "call_spawn")
REASONING = "The user wants hello.txt.\nI will patch it."
EVENTS = [
    ReasoningDelta("The user wants hello.txt.\n"),
    ReasoningDelta("I will patch it."),
    TextDelta("Creating "),
    TextDelta("the file."),
    ToolCallParsed(EXEC, 0),
    MalformedToolCall("<tool_call>x</tool_call>", "not JSON"),
    ToolCallParsed(APPLY, 1),
    ToolCallParsed(SPAWN, 2),
]
CMD_SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
GRAMMAR = 'start: "*** Begin Patch" hunk+ "*** End Patch"'
CODEX_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command.",
        "strict": False,
        "parameters": CMD_SCHEMA,
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
    },
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "description": "Spawn one.",
                "parameters": {"type": "object", "properties": {}},
            },
            {
                "type": "function",
                "name": "wait_agent",
                "description": "Wait.",
                "parameters": {"type": "object", "properties": {}},
            },
        ],
    },
    {"type": "web_search", "external_web_access": False},
]
META = StreamMeta("c0ffee", "gpt-test", 1700000000, 200)
EVENT_MODELS = {
    typing.get_args(m.model_fields["type"].annotation)[0]: m
    for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def completion(
    content: str = "Creating the file.",
    reasoning: str | None = REASONING,
    calls: tuple[ToolCall, ...] = (EXEC, APPLY, SPAWN),
    finish: FinishReason = FinishReason.STOP,
) -> Completion:
    return Completion("c0ffee", "gpt-test", 1700000000, content, reasoning, calls, finish, Usage(200, 31))


def codex_request() -> OpenAIResponsesRequest:
    return CODEC.parse_request({"model": "gpt-test", "input": "hi", "tools": CODEX_TOOLS})


def frames_for(done: Completion, request: OpenAIResponsesRequest | None, events=EVENTS) -> list[str]:
    encoder = CODEC.stream_encoder(META, request=request)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    return frames + encoder.finish(done)


def decoded(frames: list[str]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        event_line, data_line = frame.strip("\n").split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        out.append(data)
    return out


class Harness:
    """SDK clients whose transport is the codec; the last parsed request is kept for assertions."""

    def __init__(self, reply: Callable[[OpenAIResponsesRequest], httpx.Response]):
        self.reply = reply
        self.request: OpenAIResponsesRequest | None = None

    def handle(self, http: httpx.Request) -> httpx.Response:
        self.request = CODEC.parse_request(json.loads(http.content))
        return self.reply(self.request)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(self.handle)),
        )

    def async_client(self) -> openai.AsyncOpenAI:
        async def handle(http: httpx.Request) -> httpx.Response:
            return self.handle(http)

        return openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(handle)),
        )


def sse_reply(done: Completion, events=EVENTS) -> Callable[[OpenAIResponsesRequest], httpx.Response]:
    def reply(request: OpenAIResponsesRequest) -> httpx.Response:
        body = "".join(frames_for(done, request, events)).encode()
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return reply


def assert_codex_output(response) -> None:
    """The reply of ``completion()`` to a Codex-tooled request, as SDK objects."""
    reasoning, message, exec_call, patch_call, spawn_call = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == REASONING
    assert reasoning.encrypted_content == encode_reasoning(REASONING)
    assert message.type == "message" and response.output_text == "Creating the file."
    assert (exec_call.type, exec_call.call_id, exec_call.name, exec_call.arguments) == (
        "function_call",
        "call_exec",
        "exec_command",
        EXEC.arguments,
    )
    assert (patch_call.type, patch_call.call_id, patch_call.name, patch_call.input) == (
        "custom_tool_call",
        "call_patch",
        "apply_patch",
        PATCH,
    )
    assert (spawn_call.type, spawn_call.name, spawn_call.namespace) == (
        "function_call",
        "spawn_agent",
        "multi_agent_v1",
    )
    assert response.status == "completed" and response.id == "resp_c0ffee"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (200, 31, 231)


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


def test_direct_response_validates_against_the_sdk_model():
    body = CODEC.response(completion(), request=codex_request())
    assert_codex_output(Response.model_validate(body))
    assert not {"output_ids", "prompt_ids", "token_ids", "logprobs"} & set(body)  # nothing for training leaks
    assert all(part["logprobs"] == [] for item in body["output"] for part in item.get("content", []))
    plain = CODEC.response(completion())  # without the request every call is a plain function_call
    assert [o["type"] for o in plain["output"]][2:] == ["function_call"] * 3
    assert plain["output"][4]["name"] == "multi_agent_v1.spawn_agent"


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
