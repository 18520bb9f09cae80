"""Bodies that once froze every session (issue 32): an Anthropic call with 100,000 tools (8.8 MB) and one whose single
tool has an 8 MiB description. Each must get a 400 at once, while other sessions' calls and health go on. Shared
by ``test_gateway_isolation`` (behaviour) and ``benchmarks/bench_big_tools.py`` (timings)."""

from __future__ import annotations

import json

TOOLS = 100_000
DESCRIPTION_CHARS = 8 * 1024 * 1024 - 1024  # under the default string limit (8 Mi characters): it must be decoded


def many_tools_body(tools: int = TOOLS) -> bytes:
    """An Anthropic Messages body declaring ``tools`` small tools."""
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    declared = [{"name": f"tool_{i:06d}", "description": "reads a file", "input_schema": schema} for i in range(tools)]
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "tools": declared}
    return json.dumps(body).encode()


def long_description_body(chars: int = DESCRIPTION_CHARS) -> bytes:
    """An OpenAI Chat body with one tool whose description is ``chars`` characters of prose."""
    text = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    tool = {"type": "function", "function": {"name": "read", "description": text, "parameters": {"type": "object"}}}
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    return json.dumps(body).encode()


def many_messages_body(messages: int) -> bytes:
    """A body of about ``messages`` one-character user and assistant messages, alternating and ending with a user
    message (the odd count at or below it): valid OpenAI Chat and Anthropic Messages alike."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range((messages - 1) | 1)]
    body = {"model": "tiny", "max_tokens": 2, "messages": turns}
    return json.dumps(body).encode()
