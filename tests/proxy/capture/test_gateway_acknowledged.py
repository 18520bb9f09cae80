"""Acknowledged means delivered: a capture that commits after its caller got a 503 (a phantom commit) is marked
``UNACKNOWLEDGED`` and never becomes a parent or a trained token; a stream whose commit fails ends with the error
event instead of its last content, and a client that keeps the text it got is ``unresolved`` (poisoned)."""

from __future__ import annotations

import asyncio
import json
import time

import sqlalchemy as sa

from db import make_engine
from polar.backends.local import LocalBackend
from polar.errors import StoreError
from tests.pg import needs_postgres, postgres_schema, schema_url
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": f"reply number {i}, with some words"} for i in range(8)]}
HI = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@needs_postgres
def test_a_capture_committed_after_its_caller_got_a_503_is_unacknowledged(tmp_path, cache_dir, engine):
    with postgres_schema() as schema:
        url = schema_url(schema)
        settings = settings_for(tmp_path, cache_dir, database_url=url, session_cache_ttl_s=60)
        asyncio.run(_phantom(settings, engine, url))


async def _phantom(settings, engine, url: str) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        sessions = [await open_session(client, policy=SCRIPT) for _ in range(2)]
        gw.calls.recorder.store_timeout_s = 1.0  # callers give up long before the store's own statement timeout
        locker = make_engine(url)
        conn = locker.connect()
        held = conn.begin()
        ids = tuple(s["session_id"] for s in sessions)
        conn.execute(
            sa.text("SELECT id FROM rollouts WHERE id IN :ids FOR UPDATE").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": list(ids)},
        )
        try:
            replies = await asyncio.gather(
                *(
                    client.post("/v1/chat/completions", json=HI, headers={"Authorization": f"Bearer {s['api_key']}"})
                    for s in sessions
                )
            )
            assert [r.status_code for r in replies] == [503, 503], [r.text for r in replies]
        finally:
            held.rollback()  # the writer's transaction, waiting on the lock, now commits both rows
            conn.close()
            locker.dispose()
        deadline = time.monotonic() + 30  # a bound for the test, not a timing assertion
        while True:
            per_session = [await captures(client, s["session_id"]) for s in sessions]
            rows = [row for listed in per_session for row in listed]
            if rows and all(r["status"] == "UNACKNOWLEDGED" for r in rows) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        # The batch whose transaction had begun committed (a row whose caller gave up before its batch began is
        # not written at all): every row that landed is marked.
        assert rows and all(r["status"] == "UNACKNOWLEDGED" for r in rows), rows
        # The harness retries: a new reply, a root of its own; the phantom is no one's parent.
        first = next(s for s, listed in zip(sessions, per_session, strict=True) if listed)
        again = await client.post(
            "/v1/chat/completions", json=HI, headers={"Authorization": f"Bearer {first['api_key']}"}
        )
        assert again.status_code == 200, again.text
        rows = await captures(client, first["session_id"])
        assert [(r["status"], r["parent_id"]) for r in rows] == [("UNACKNOWLEDGED", None), ("OK", None)]


def test_a_stream_whose_commit_fails_withholds_its_last_content_and_poisons_the_chain(tmp_path, cache_dir, engine):
    asyncio.run(_stream_fails(settings_for(tmp_path, cache_dir, session_cache_ttl_s=60), engine))


async def _stream_fails(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        store = gw.writer.store

        async def failing_once(row, **kwargs):
            gw.writer.store = store  # type: ignore[method-assign]  # the error capture commits
            raise StoreError("the store is down (test)")

        gw.writer.store = failing_once  # type: ignore[method-assign]
        reply = await client.post("/v1/chat/completions", json={**HI, "stream": True}, headers=headers)
        events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", ()))
        assert "error" in events[-1], events[-1]
        assert text and text != SCRIPT["replies"][0]["content"]  # the last content never left
        # A client that keeps what it got anyway: served, but unresolved (its history holds a reply no capture made).
        kept = {"role": "assistant", "content": text}
        body = {"model": "tiny", "messages": [*HI["messages"], kept, {"role": "user", "content": "go on"}]}
        nxt = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert nxt.status_code == 200, nxt.text
        rows = [r for r in await captures(client, session["session_id"]) if r["status"] == "OK"]
        assert [(r["admission"], r["admission_cause"]) for r in rows] == [("unresolved", "history_edited")]
