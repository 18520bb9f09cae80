"""The ids a session's history keeps in the gateway's memory: an agent's chain keeps them once, on its line (no
call of it keeps a prompt or delta of its own), a branch keeps its own tip's prompt, and every call's prompt, a
branch's included, is the one the store's deltas rebuild."""

from __future__ import annotations

import asyncio

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import CONTROL, asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i}"} for i in range(8)]}


def test_a_chain_keeps_one_prompt_and_every_prompt_is_the_stored_one(tmp_path, cache_dir, engine):
    asyncio.run(_prompts(settings_for(tmp_path, cache_dir, session_cache_ttl_s=60), engine))


async def _prompts(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        sid, headers = session["session_id"], {"Authorization": f"Bearer {session['api_key']}"}

        async def call(messages: list) -> str:
            reply = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "messages": messages}, headers=headers
            )
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]["content"]

        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        before: list[list] = []  # the conversation each call was made with, and its reply
        for turn in range(4):
            before.append(list(messages))
            content = await call(messages)
            before[-1].append({"role": "assistant", "content": content})
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        history = gw.histories.cached(sid)
        assert history is not None and not history.prompts
        line = history.line
        assert all(node.line is line for node in history.nodes.values())
        tip = history.nodes[line.tip]
        assert len(line) == tip.n_prompt + tip.n_output  # each id once: the tip's prompt, then its output
        # A branch from the third call (the tip's parent: its prompt is a prefix of the line), then the chain.
        await call([*before[2], {"role": "user", "content": "other"}])
        await call(messages)
        assert len(history.prompts) == 1  # the branch's; the chain's calls are on the line
        tip = history.nodes[history.line.tip]
        assert history.line is line and len(line) == tip.n_prompt + tip.n_output
        branch = [node for node in history.nodes.values() if node.line is None]
        assert len(branch) == 1 and list(history.prompts) == [branch[0].id]
        listed = await client.get(f"/v1/sessions/{sid}/captures", params={"full_prompt": True}, headers=CONTROL)
        rows = listed.json()["captures"]
        assert [r["parent_id"] for r in rows] == [
            None,
            rows[0]["id"],
            rows[1]["id"],
            rows[2]["id"],
            rows[2]["id"],
            rows[3]["id"],
        ]
        for row in rows:
            assert list(history.full_prompt(row["id"])) == row["prompt_ids"], row["seq"]
