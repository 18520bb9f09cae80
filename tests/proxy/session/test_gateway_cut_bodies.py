"""A session's turns decoded on the bytes of its previous request (``json_guard.CutBody``): each steady turn
decodes only the messages it adds, and every capture still stores the request exactly as the harness sent it,
whether its parent is the previous request's call or another one (a refused call in between)."""

from __future__ import annotations

import asyncio

import orjson

from polar.backends.local import LocalBackend
from polar.proxy.call import decode
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i}"} for i in range(8)]}
TOOLS = [{"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}}]


def test_steady_turns_decode_only_what_they_add_and_store_what_was_sent(tmp_path, cache_dir, engine, monkeypatch):
    cuts: list[int] = []
    parse = decode.parse_json_after

    def spied(*args, **kwargs):
        parsed = parse(*args, **kwargs)
        cuts.append(parsed.cut.count if parsed.cut is not None else 0)
        return parsed

    monkeypatch.setattr(decode, "parse_json_after", spied)
    asyncio.run(_session(settings_for(tmp_path, cache_dir), engine, cuts))


async def _session(settings, engine, cuts: list[int]) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_, client):
        session = await open_session(client, policy=SCRIPT)
        headers = {"Authorization": f"Bearer {session['api_key']}", "Content-Type": "application/json"}
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        sent: list[dict] = []

        async def call(body: dict) -> tuple[int, dict]:
            reply = await client.post("/v1/chat/completions", content=orjson.dumps(body), headers=headers)
            return reply.status_code, reply.json()

        for turn in range(4):
            body = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 4}
            status, reply = await call(body)
            assert status == 200, reply
            sent.append(body)
            messages = [*messages, reply["choices"][0]["message"], {"role": "user", "content": f"more {turn}"}]
        # Every turn after the first decoded only its two new messages.
        assert cuts == [0, 2, 4, 6]

        # A turn refused after its decode (a sampling value no engine takes) is the previous request still; the
        # next turn is cut on its bytes, but its parent is the call before it, so it is stored whole-decoded.
        refused = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 4, "top_k": 0}
        status, reply = await call(refused)
        assert status == 400 and "top_k" in str(reply), reply
        body = {"model": "tiny", "messages": [*messages, {"role": "user", "content": "again"}], "tools": TOOLS}
        status, reply = await call(body)
        assert status == 200, reply
        sent.append(body)
        assert cuts[-2:] == [8, 10]

        stored = await captures(client, session["session_id"], requests=True)
        assert [c["request"] for c in stored] == sent
