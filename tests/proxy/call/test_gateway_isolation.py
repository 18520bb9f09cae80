"""One session's huge request never holds the others: while one sends 100,000 tools and another an 8 MiB tool
description, eight other sessions' calls (four protocols, streamed and not) succeed, ``/health/live`` answers, and
both big requests get the provider's 400 (the cost bound, before any tokenization). A live gateway on a loopback
port (real sockets), the tiny local model. Timings are ``benchmarks/bench_big_tools.py``'s, not asserted here.
"""

from __future__ import annotations

import asyncio

import httpx

from polar.backends.local import LocalBackend
from polar.proxy.call.cost import MIN_TOOL_CHARS
from tests.proxy.big_bodies import TOOLS, long_description_body, many_tools_body
from tests.proxy.gateway_server import GatewayServer, settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem, stream_outcome


def test_huge_requests_get_a_400_while_other_sessions_and_health_go_on(tmp_path, cache_dir, engine):
    with GatewayServer(settings_for(tmp_path, cache_dir, default_max_tokens=2), backend=LocalBackend(engine)) as gw:
        keys = [gw.session()["api_key"] for _ in range(10)]
        asyncio.run(_scenario(gw.url, keys, gw.gateway.calls.max_token_chars))
        # both refusals came from the screening process: the gateway's own process decoded neither body
        assert gw.gateway.screen.screened == 2 and gw.gateway.screen.failed == 0


async def _scenario(url: str, keys: list[str], max_token_chars: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        big = [
            asyncio.create_task(_post(client, "/v1/messages", many_tools_body(), {"x-api-key": keys[0]})),
            asyncio.create_task(
                _post(client, "/v1/chat/completions", long_description_body(), {"Authorization": f"Bearer {keys[1]}"})
            ),
        ]
        health = asyncio.create_task(_health(client, big))
        calls = [
            _call(client, protocol, stream, keys[2 + i])
            for i, (protocol, stream) in enumerate((p, s) for p in PROTOCOLS.values() for s in (False, True))
        ]
        outcomes = await asyncio.gather(*calls)
        tools_reply, description_reply = await asyncio.gather(*big)
        answered = await health
    assert outcomes == ["ok"] * 8, outcomes
    assert tools_reply.status_code == 400, tools_reply.text[:300]
    assert error_problem("anthropic", 400, tools_reply.json()) is None
    # the bound from the count of tools alone: no walk, no tokenization
    assert f"{TOOLS * MIN_TOOL_CHARS // max_token_chars} tokens" in tools_reply.text
    assert description_reply.status_code == 400, description_reply.text[:300]
    assert error_problem("openai_chat", 400, description_reply.json()) is None
    assert "at least" in description_reply.text  # the bound, not a tokenization
    assert answered and all(status == 200 for status in answered), answered


async def _post(client: httpx.AsyncClient, path: str, raw: bytes, headers: dict[str, str]) -> httpx.Response:
    return await client.post(path, content=raw, headers={**headers, "content-type": "application/json"})


async def _health(client: httpx.AsyncClient, big: list[asyncio.Task]) -> list[int]:
    """Statuses of ``/health/live`` polled until both big requests are answered."""
    statuses = []
    while not all(task.done() for task in big) or not statuses:
        statuses.append((await client.get("/health/live")).status_code)
        await asyncio.sleep(0.02)
    return statuses


async def _call(client: httpx.AsyncClient, protocol, stream: bool, key: str) -> str:
    await asyncio.sleep(0.05)  # the big bodies are on their way first
    reply = await client.post(protocol.url(stream), json=protocol.body(stream=stream), headers=protocol.headers(key))
    if reply.status_code != 200:
        return f"{protocol.name} stream={stream}: {reply.status_code} {reply.text[:200]}"
    if stream and stream_outcome(protocol.name, reply.text) != "complete":
        return f"{protocol.name} stream={stream}: {reply.text[-200:]}"
    return "ok"
