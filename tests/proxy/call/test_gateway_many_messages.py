"""A body of 200,000 one-character messages is refused from its shape (each message costs the chat template's
per-message tokens: ``polar.proxy.call.cost``) with the provider's 400, and the gateway's event loop never waits on
it: ``/health/live``, polled all the while, answers every probe in under 100 ms. OpenAI Chat and Anthropic
Messages, a live gateway on a loopback port (real sockets), the tiny local model."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar.backends.local import LocalBackend
from polar.proxy.call.cost import CostBound, marker_ids, message_tokens
from polar.proxy.call.screen import ScreenRules, screen
from polar.tokens.render import PromptBuilder
from polar.wire.json_guard import JsonLimits
from tests.proxy.big_bodies import many_messages_body
from tests.proxy.gateway_server import GatewayServer, settings_for
from tests.proxy.shapes import error_problem

MESSAGES = 200_000
HEALTH_MAX_S = 0.100


def test_the_template_costs_two_marker_tokens_a_message(small_tokenizer):
    builder = PromptBuilder(small_tokenizer)
    assert small_tokenizer.im_start_id in marker_ids(small_tokenizer)
    # <|im_start|> ... <|im_end|> for a turn; <tool_response> ... </tool_response> for a result merged into one
    assert message_tokens(builder) == 2


def test_the_shape_bound_charges_every_message_but_the_last_and_no_system_one():
    bound = CostBound(max_token_chars=16, context_length=100, message_tokens=2)
    assert bound.surely_too_long(0, 51) is None  # 50 charged messages: 100 tokens fit
    error = bound.surely_too_long(0, 52)
    assert error is not None and "at least 102 tokens" in error.message
    system_only = b'{"model": "m", "messages": [' + b'{"role": "system", "content": "x"},' * 500 + b"1]}"
    with pytest.raises(Exception, match="messages.500") as refused:  # validation names it; no bound from systems
        screen(system_only, ScreenRules("openai_chat", JsonLimits(), bound))
    assert "tokens" not in str(refused.value)


@pytest.mark.parametrize(
    ("protocol", "path", "header"),
    [("openai_chat", "/v1/chat/completions", "authorization"), ("anthropic", "/v1/messages", "x-api-key")],
)
def test_many_messages_are_refused_from_their_shape_while_health_answers(
    tmp_path, cache_dir, engine, protocol, path, header
):
    with GatewayServer(settings_for(tmp_path, cache_dir, default_max_tokens=2), backend=LocalBackend(engine)) as gw:
        key = gw.session()["api_key"]
        raw = many_messages_body(MESSAGES)
        value = f"Bearer {key}" if header == "authorization" else key
        (status, text), probes = asyncio.run(_refused_while_polled(gw.url, path, raw, {header: value}, tmp_path))
    assert status == 400, text[:300]
    assert error_problem(protocol, 400, json.loads(text)) is None
    bound = gw.gateway.calls.planner.bound
    charged = (MESSAGES - 2) * bound.message_tokens  # every message but the last; their text adds a little more
    assert int(re.search(r"(\d{6,}) tokens", text).group(1)) >= charged, text
    if protocol == "openai_chat":
        assert json.loads(text)["error"]["param"] == "messages"
    assert len(probes) >= 3 and max(probes) < HEALTH_MAX_S, (len(probes), sorted(probes)[-5:], probes[:8])


async def _refused_while_polled(
    url: str, path: str, raw: bytes, headers: dict[str, str], tmp_path: Path
) -> tuple[tuple[int, str], list[float]]:
    """The big body's status and text, sent by a process of its own (its upload takes none of this process's
    interpreter lock, which the gateway's thread shares), and ``/health/live``'s latencies while it was handled."""
    body = tmp_path / "body.json"
    body.write_bytes(raw)
    sender = _SEND.format(url=url + path, body=str(body), headers={**headers, "content-type": "application/json"})
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await client.get("/health/live")  # the connection pool warm: probes time the gateway, not a connect
        probes: list[float] = []
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", sender, stdout=asyncio.subprocess.PIPE)
        replied = asyncio.create_task(child.communicate())
        while not replied.done() or len(probes) < 3:
            started = time.perf_counter()
            assert (await client.get("/health/live")).status_code == 200
            probes.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        out, _ = await replied
    status, text = out.decode().split("\n", 1)
    return (int(status), text), probes


_SEND = """
import httpx, pathlib
reply = httpx.post({url!r}, content=pathlib.Path({body!r}).read_bytes(), headers={headers!r}, timeout=120)
print(reply.status_code)
print(reply.text, end="")
"""
