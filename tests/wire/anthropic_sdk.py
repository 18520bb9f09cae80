"""The anthropic SDK wired to the Anthropic Messages codec, for the tests/wire/test_anthropic_*.py files.

Holds the scripted completion (reasoning, text, two tool calls) and the parser events that stream it, its SSE
body (``sse_body``), ``Gateway`` (a MockTransport handler whose ``client()`` and ``async_client()`` are real
SDK clients: each body is parsed by the codec and answered with a scripted reply) and ``CREATE_ARGS``, the
``messages.create`` arguments the tests send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx

from polar.errors import PolarError
from polar.inference import FinishReason
from polar.tokens.messages import ToolCall
from polar.tokens.parsers import (
    Event,
    MalformedToolCall,
    ReasoningDelta,
    TextDelta,
    ToolCallParsed,
)
from polar.wire.anthropic import CODEC
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion, Usage

PROMPT_TOKENS = 1234
WRITE = ToolCall("Write", '{"file_path": "hello.txt", "content": "hi"}', id="call_w1")
BASH = ToolCall("Bash", '{"command": "ls -la"}', id="toolu_b2")
EVENTS: list[Event] = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("a file."),
    TextDelta("Writing "),
    TextDelta("it now."),
    ToolCallParsed(WRITE, 0),
    MalformedToolCall("<tool_call>oops", "unclosed"),
    ToolCallParsed(BASH, 1),
]
TOOLS = [
    {"name": "Write", "description": "Write a file", "input_schema": {"type": "object", "properties": {}}},
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}},
]


def completion(**overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "id": "gen-1",
        "model": "capture-model",
        "created": 1700000000,
        "content": "Writing it now.",
        "reasoning": "The user wants a file.",
        "tool_calls": (WRITE, BASH),
        "finish_reason": FinishReason.STOP,
        "usage": Usage(PROMPT_TOKENS, 42),
    }
    return Completion(**(fields | overrides))


META = StreamMeta(completion_id="gen-1", model="capture-model", created=1700000000, prompt_tokens=PROMPT_TOKENS)


def sse_body(events: list[Event], done: Completion | None = None, error: PolarError | None = None) -> str:
    encoder = CODEC.stream_encoder(META)
    frames = encoder.start()
    for event in events:
        frames += encoder.on_event(event)
    frames += encoder.error(error) if error is not None else encoder.finish(done or completion())
    return "".join(frames)


class Gateway:
    """A MockTransport handler that parses each body with the codec and answers with a scripted reply."""

    def __init__(self, reply: Callable[[ChatRequest], httpx.Response] | None = None):
        self.requests: list[ChatRequest] = []
        self.urls: list[str] = []
        self._reply = reply

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        chat = CODEC.parse_request(json.loads(request.content))
        self.requests.append(chat)
        if self._reply is not None:
            return self._reply(chat)
        if chat.stream:
            return httpx.Response(200, text=sse_body(EVENTS), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=CODEC.response(completion()))

    def client(self) -> anthropic.Anthropic:
        transport = httpx.MockTransport(self)
        return anthropic.Anthropic(
            api_key="k", base_url="http://gateway.test", http_client=httpx.Client(transport=transport), max_retries=0
        )

    def async_client(self) -> anthropic.AsyncAnthropic:
        transport = httpx.MockTransport(self)
        return anthropic.AsyncAnthropic(
            api_key="k",
            base_url="http://gateway.test",
            http_client=httpx.AsyncClient(transport=transport),
            max_retries=0,
        )


CREATE_ARGS: dict[str, Any] = {
    "model": "capture-model",
    "max_tokens": 512,
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "Create hello.txt"}],
    "tools": TOOLS,
    "temperature": 0.7,
    "top_k": 20,
    "stop_sequences": ["<END>"],
}
