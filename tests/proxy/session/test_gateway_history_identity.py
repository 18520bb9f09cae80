"""An agent's history is matched to its previous call by object identity, not message by message: the request is
decoded on top of the session's previous one (``parse_json_after`` / ``parse_extension``), and both hold the
history node's own message objects. A full decode (the previous request forgotten: a key this process had not
checked, a body that went the lenient way) costs one semantic comparison, and identity holds again from the next
call."""

from __future__ import annotations

import asyncio

from polar.backends.local import LocalBackend
from polar.tokens import matching
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i}"} for i in range(6)]}


def test_history_is_matched_by_identity_again_after_a_full_decode(tmp_path, cache_dir, engine, monkeypatch):
    compared: list[int] = []
    same_message = matching.same_message

    def counted(a, b):
        compared.append(1)
        return same_message(a, b)

    monkeypatch.setattr(matching, "same_message", counted)
    asyncio.run(_session(settings_for(tmp_path, cache_dir, session_cache_ttl_s=60), engine, compared))


async def _session(settings, engine, compared: list[int]) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        per_call = []
        for turn in range(6):
            if turn == 2:
                gw.histories.forget_request(session["session_id"])  # this call is decoded from scratch
            compared.clear()
            reply = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "messages": messages}, headers=headers
            )
            assert reply.status_code == 200, reply.text
            per_call.append(len(compared))
            content = reply.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        assert per_call[:2] == [0, 0]
        assert per_call[2] > 0  # the fresh decode: its history compared message by message, once
        assert per_call[3:] == [0, 0, 0], per_call
