"""The official openai SDK wired to the openai_chat codec, for the tests/wire/test_openai_chat*.py files.

Holds the scripted completion (reasoning, text, two tool calls) and the parser events that stream it,
``Harness`` (SDK clients whose MockTransport runs each request through ``parse_request`` and answers with a
scripted reply: ``json_reply`` from ``response()``, ``sse_reply`` from ``stream_encoder`` frames, which
``sse_frames`` builds) and ``VALID``, a request body in every shape a harness sends (the junk tests edit it).
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
from polar.wire.openai_chat import CODEC, OpenAIChatRequest

WRITE = ToolCall("write_file", '{"path": "hello.txt", "content": "hi"}', "call_write")
BASH = ToolCall("bash", '{"cmd":"ls -la"}', "call_bash")
EVENTS = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("a file."),
    TextDelta("I'll write "),
    TextDelta("it."),
    ToolCallParsed(WRITE, 0),
    MalformedToolCall("<tool_call>oops</tool_call>", "not JSON"),  # its text came as TextDelta already
    ToolCallParsed(BASH, 1),
]
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": SCHEMA}}]


def completion(
    content: str = "I'll write it.",
    reasoning: str | None = "The user wants a file.",
    calls: tuple[ToolCall, ...] = (WRITE, BASH),
    finish: FinishReason = FinishReason.STOP,
) -> Completion:
    return Completion("c0ffee", "tiny", 1700000000, content, reasoning, calls, finish, Usage(120, 17))


META = StreamMeta("c0ffee", "tiny", 1700000000, 120)


class Harness:
    """An SDK client whose transport is the codec: the last parsed request is kept for assertions."""

    def __init__(self, reply: Callable[[OpenAIChatRequest], httpx.Response]):
        self.reply = reply
        self.request: OpenAIChatRequest | None = None

    def handle(self, http: httpx.Request) -> httpx.Response:
        self.request = CODEC.parse_request(json.loads(http.content))
        return self.reply(self.request)

    def client(self) -> openai.OpenAI:
        transport = httpx.MockTransport(self.handle)
        return openai.OpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )

    def async_client(self) -> openai.AsyncOpenAI:
        async def handle(http: httpx.Request) -> httpx.Response:
            return self.handle(http)

        transport = httpx.MockTransport(handle)
        return openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )


def json_reply(done: Completion) -> Callable[[OpenAIChatRequest], httpx.Response]:
    return lambda request: httpx.Response(200, json=CODEC.response(done, request=request))


def sse_frames(done: Completion, request: OpenAIChatRequest | None, events=EVENTS) -> list[str]:
    encoder = CODEC.stream_encoder(META, request=request)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    return frames + encoder.finish(done)


def sse_reply(done: Completion, events=EVENTS) -> Callable[[OpenAIChatRequest], httpx.Response]:
    def reply(request: OpenAIChatRequest) -> httpx.Response:
        body = "".join(sse_frames(done, request, events))
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    return reply


VALID = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "u"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ],
    "tools": TOOLS,
    "stop": ["x"],
    "stream_options": {"include_usage": True},
}
