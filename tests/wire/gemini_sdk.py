"""The google-genai SDK wired to the Gemini codec, for the tests/wire/test_gemini_*.py files.

Holds the scripted completion (reasoning, text, two tool calls) and the parser events that stream it, its SSE
body (``sse_body``), ``Gateway`` (a MockTransport handler whose ``client()`` is a real ``genai.Client``: the
model and streaming are read from the URL, each body is parsed by the codec and answered) and ``CONFIG``, the
``GenerateContentConfig`` the tests send.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
from google import genai
from google.genai import types

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
from polar.wire.base import StreamMeta
from polar.wire.canonical import ChatRequest, Completion, Usage
from polar.wire.gemini import CODEC

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
