"""Values the providers refuse are refused by the gateway too, with a 400 naming the field in the caller's own error
shape, never a 5xx: tool-call arguments nested past any parser's depth or holding an integer of 5,000 digits (in
every protocol that carries them, streamed and not), tool schemas that are not JSON schemas, an unknown reasoning
effort, more than four stop sequences on OpenAI Chat. Raw HTTP against a live gateway (the SDKs type these fields
and would not send most of them)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from tests.proxy.shapes import PROTOCOLS, error_problem

DEEP = "[" * 1200 + "]" * 1200
HUGE = '{"n": ' + "7" * 5000 + "}"


def _deep_object(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _with_call(protocol: str, arguments: str) -> tuple[dict[str, Any], str]:
    """A body whose history holds one tool call with ``arguments`` (as text, or as the JSON the protocol carries)
    and its result; the field the refusal names."""
    if protocol == "openai_chat":
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        return {"model": "tiny", "max_tokens": 2, "messages": messages}, "messages[1].tool_calls[0].function.arguments"
    if protocol == "openai_responses":
        items = [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]
        return {"model": "tiny", "max_output_tokens": 2, "input": items}, "input[1].arguments"
    value = _deep_object(100) if arguments == DEEP else {"n": 10**30}  # JSON in the body: the body's own limits
    if protocol == "anthropic":
        use = {"type": "tool_use", "id": "c1", "name": "f", "input": value}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "ok"}]},
        ]
        return {"model": "tiny", "max_tokens": 2, "messages": messages}, "messages"
    contents = [
        {"role": "user", "parts": [{"text": "hi"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": value}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "ok"}}}]},
    ]
    return {"contents": contents, "generationConfig": {"maxOutputTokens": 2}}, "contents"


def _post(gateway, protocol: str, body: dict[str, Any], stream: bool) -> httpx.Response:
    shape = PROTOCOLS[protocol]
    if protocol != "gemini":
        body = {**body, "stream": stream}
    key = gateway.session()["api_key"]
    return httpx.post(gateway.url + shape.url(stream), json=body, headers=shape.headers(key), timeout=60)


def _refused(reply: httpx.Response, protocol: str, field: str) -> None:
    assert reply.status_code == 400, reply.text[:300]
    assert error_problem(protocol, 400, reply.json()) is None
    assert field in reply.text, reply.text[:300]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize("arguments", [DEEP, HUGE], ids=["deep", "huge-integer"])
def test_unreadable_tool_arguments_are_a_400(gateway, protocol, stream, arguments):
    body, field = _with_call(protocol, arguments)
    _refused(_post(gateway, protocol, body, stream), protocol, field)


SCHEMAS = {
    "openai_chat": (["tools", 0, "function", "parameters"], "tools[0].function.parameters"),
    "openai_responses": (["tools", 0, "parameters"], "tools[0].parameters"),
    "anthropic": (["tools", 0, "input_schema"], "tools[0].input_schema"),
    "gemini": (["tools", 0, "functionDeclarations", 0, "parametersJsonSchema"], "parametersJsonSchema"),
}


def _with_tool(protocol: str) -> dict[str, Any]:
    body = PROTOCOLS[protocol].body()
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    if protocol == "openai_chat":
        body["tools"] = [{"type": "function", "function": {"name": "read", "parameters": schema}}]
    elif protocol == "openai_responses":
        body["tools"] = [{"type": "function", "name": "read", "parameters": schema}]
    elif protocol == "anthropic":
        body["tools"] = [{"name": "read", "input_schema": schema}]
    else:
        body["tools"] = [{"functionDeclarations": [{"name": "read", "parametersJsonSchema": schema}]}]
    return body


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize(
    "schema",
    ["an object", [1, 2], {"type": 5}, {"type": "object", "properties": {"p": {"type": "strin"}}}, {"required": "p"}],
    ids=["string", "list", "type-5", "bad-nested-type", "required-string"],
)
def test_tool_schemas_that_are_not_json_schemas_are_a_400(gateway, protocol, schema):
    body = _with_tool(protocol)
    path, field = SCHEMAS[protocol]
    holder = body
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = copy.deepcopy(schema)
    _refused(_post(gateway, protocol, body, False), protocol, field)


def test_a_valid_tool_schema_passes(gateway):
    for protocol in PROTOCOLS:
        reply = _post(gateway, protocol, _with_tool(protocol), False)
        assert reply.status_code == 200, (protocol, reply.text[:300])


@pytest.mark.parametrize(
    ("protocol", "extra", "field"),
    [
        ("openai_chat", {"reasoning_effort": "extreme"}, "reasoning_effort"),
        ("openai_responses", {"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ("openai_chat", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_values_openai_refuses_are_a_400(gateway, protocol, extra, field):
    body = {**PROTOCOLS[protocol].body(), **extra}
    _refused(_post(gateway, protocol, body, False), protocol, field)


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [
        *[("openai_chat", {"reasoning_effort": e}) for e in ("none", "minimal", "low", "medium", "high", "xhigh")],
        ("openai_responses", {"reasoning": {"effort": "minimal", "summary": "auto"}}),
        ("openai_chat", {"stop": ["a", "b", "c", "d"]}),
        ("anthropic", {"stop_sequences": [str(i) for i in range(20)]}),
    ],
)
def test_documented_values_pass(gateway, protocol, extra):
    reply = _post(gateway, protocol, {**PROTOCOLS[protocol].body(), **extra}, False)
    assert reply.status_code == 200, reply.text[:300]
