"""The official SDKs against a live gateway: parsed tool calls, and a capture with token ids per call."""

from __future__ import annotations

import itertools
import json

import anthropic
import openai
import pytest
import sqlalchemy as sa
from google import genai
from google.genai import types as gtypes

from db import Capture, session_scope
from db.request_json import is_delta

WRITE = {"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi"}}
SCRIPT = {
    "type": "scripted",
    "replies": [{"content": "I will write it.", "tool_calls": [WRITE]}, {"content": "Done: hello.txt written."}],
}
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}


def check_chain(gateway, session, n):
    captures = gateway.captures(session["session_id"], requests=True)
    assert [c["status"] for c in captures] == ["OK"] * n
    for c in captures:
        assert c["n_output"] == len(c["output_ids"]) == len(c["output_logprobs"]) > 0
        assert c["n_prompt"] == len(c["prompt_ids"])
    for parent, child in itertools.pairwise(captures):
        assert child["parent_id"] == parent["id"] and child["render_mode"] == "append"
        sequence = parent["prompt_ids"] + parent["output_ids"]
        assert child["prompt_ids"][: len(sequence)] == sequence  # sampled ids of turn k inside turn k+1
    # Requests are stored relative to the parent's, and come back whole.
    with session_scope(gateway.gateway.factory) as db:
        stored = db.scalars(
            sa.select(Capture.request_json).where(Capture.rollout_id == session["session_id"]).order_by(Capture.seq)
        ).all()
    assert not is_delta(stored[0]) and all(is_delta(s) for s in stored[1:])
    assert all(json.dumps(s) != json.dumps(c["request"]) for s, c in zip(stored[1:], captures[1:], strict=True))
    assert len(json.dumps(stored[-1])) < len(json.dumps(captures[-1]["request"]))
    return captures


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat(gateway, stream):
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [
        {
            "type": "function",
            "function": {"name": "write_file", "description": "Write a file", "parameters": TOOL_SCHEMA},
        }
    ]
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Write hello.txt"}]

    def call():
        if not stream:
            return client.chat.completions.create(model="tiny", messages=messages, tools=tools).choices[0]
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, tools=tools, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return text, calls, finish[-1]

    first = call()
    if stream:
        text, calls, finish = first
        assert text == "I will write it." and finish == "tool_calls"
        assert calls[0].function.name == "write_file" and json.loads(calls[0].function.arguments) == WRITE["arguments"]
        call_id = calls[0].id
        assistant = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "write_file", "arguments": calls[0].function.arguments},
                }
            ],
        }
    else:
        assert first.finish_reason == "tool_calls" and first.message.content == "I will write it."
        call_id = first.message.tool_calls[0].id
        assert json.loads(first.message.tool_calls[0].function.arguments) == WRITE["arguments"]
        assistant = first.message.model_dump(exclude_none=True)
    messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    second = call()
    assert (second[0] if stream else second.message.content) == "Done: hello.txt written."
    check_chain(gateway, session, 2)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses(gateway, stream):
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "name": "write_file", "description": "Write a file", "parameters": TOOL_SCHEMA}]
    items: list = [{"role": "user", "content": "Write hello.txt"}]

    def call():
        if stream:
            with client.responses.stream(model="tiny", input=items, tools=tools, instructions="You are an agent.") as s:
                return s.get_final_response()
        return client.responses.create(model="tiny", input=items, tools=tools, instructions="You are an agent.")

    first = call()
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "write_file" and json.loads(calls[0].arguments) == WRITE["arguments"]
    assert first.output_text == "I will write it."
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"})
    second = call()
    assert second.output_text == "Done: hello.txt written."
    check_chain(gateway, session, 2)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(gateway, stream):
    session = gateway.session(SCRIPT)
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    tools = [{"name": "write_file", "description": "Write a file", "input_schema": TOOL_SCHEMA}]
    messages: list = [{"role": "user", "content": "Write hello.txt"}]

    def call():
        kwargs = dict(model="tiny", max_tokens=256, system="You are an agent.", messages=messages, tools=tools)
        if stream:
            with client.messages.stream(**kwargs) as s:
                return s.get_final_message()
        return client.messages.create(**kwargs)

    first = call()
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "write_file" and use.input == WRITE["arguments"]
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
    ]
    second = call()
    assert second.stop_reason == "end_turn" and second.content[0].text == "Done: hello.txt written."
    check_chain(gateway, session, 2)


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_generate_content(gateway, stream):
    session = gateway.session(SCRIPT)
    client = genai.Client(
        api_key=session["api_key"], http_options=gtypes.HttpOptions(base_url=session["base_urls"]["gemini"])
    )
    config = gtypes.GenerateContentConfig(
        system_instruction="You are an agent.",
        tools=[
            gtypes.Tool(
                function_declarations=[
                    gtypes.FunctionDeclaration(
                        name="write_file", description="Write a file", parameters_json_schema=TOOL_SCHEMA
                    )
                ]
            )
        ],
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list = [gtypes.Content(role="user", parts=[gtypes.Part(text="Write hello.txt")])]

    def call():
        if stream:
            chunks = list(client.models.generate_content_stream(model="tiny", contents=contents, config=config))
            parts = [p for c in chunks if c.candidates for p in (c.candidates[0].content.parts or [])]
            return parts
        return (
            client.models.generate_content(model="tiny", contents=contents, config=config).candidates[0].content.parts
        )

    parts = call()
    calls = [p.function_call for p in parts if p.function_call]
    assert calls and calls[0].name == "write_file" and calls[0].args == WRITE["arguments"]
    assert "".join(p.text or "" for p in parts if not p.function_call) == "I will write it."
    contents += [
        gtypes.Content(role="model", parts=parts),
        gtypes.Content(
            role="user",
            parts=[
                gtypes.Part(function_response=gtypes.FunctionResponse(name="write_file", response={"output": "ok"}))
            ],
        ),
    ]
    parts = call()
    assert "".join(p.text or "" for p in parts) == "Done: hello.txt written."
    check_chain(gateway, session, 2)
