"""The official openai SDK wired to the openai_responses codec, for the tests/wire/test_openai_responses_*.py
files.

Holds Codex's tools (a function, a custom grammar tool, a namespace, a hosted tool: ``CODEX_TOOLS``), the
scripted completion (reasoning, text, three calls) and the parser events that stream it, ``Harness`` (SDK
clients whose MockTransport runs each request through ``parse_request`` and answers with a scripted reply;
``sse_reply`` streams ``frames_for``'s frames) and ``assert_codex_output``, the SDK objects that completion
must come back as.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import openai

from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
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
