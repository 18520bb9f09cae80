"""A frozen store (SIGSTOP on a test-owned Postgres): shaped 503s within the store timeout, readiness says so,
and everything recovers after SIGCONT."""

from __future__ import annotations

import asyncio
import time

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for
from tests.proxy.own_postgres import OwnPostgres, needs_own_postgres

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
CLAUDE = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@needs_own_postgres
def test_frozen_store_gives_shaped_503_and_recovers(tmp_path, cache_dir, engine):
    with OwnPostgres() as pg:
        settings = settings_for(
            tmp_path,
            cache_dir,
            database_url=pg.url,
            store_statement_timeout_s=2.0,
            store_connect_timeout_s=2.0,
            health_timeout_s=1.0,
        )
        asyncio.run(_scenario(pg, settings, engine))


async def _scenario(pg: OwnPostgres, settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        session = await open_session(client)
        bearer = {"Authorization": f"Bearer {session['api_key']}"}
        claude = {"x-api-key": session["api_key"]}
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer)).status_code == 200
        assert (await client.get("/health/ready")).status_code == 200

        pg.freeze()
        try:
            chat = await client.post("/v1/chat/completions", json=CHAT, headers=bearer)
            assert chat.status_code == 503, chat.text
            assert "store" in chat.json()["error"]["message"] and "2 s" in chat.json()["error"]["message"]
            assert chat.headers["retry-after"] == "1"  # every retryable 5xx says when to retry
            messages = await client.post("/v1/messages", json=CLAUDE, headers=claude)
            assert messages.status_code == 503, messages.text
            assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "overloaded_error"
            assert messages.headers["retry-after"] == "1"
            ready = await client.get("/health/ready")
            assert ready.status_code == 503, ready.text
            assert ready.headers["retry-after"] == "1"
            assert ready.json()["status"] == "not_ready" and ready.json()["checks"]["store"]["ok"] is False
            assert ready.json()["checks"]["backend"]["ok"] is True
            assert (await client.get("/health")).status_code == 503
            assert (await client.get("/health/live")).status_code == 200
        finally:
            pg.thaw()

        deadline = time.monotonic() + 60  # a bound for the test, not a timing assertion
        while True:
            reply = await client.post("/v1/chat/completions", json=CHAT, headers=bearer)
            if reply.status_code == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert reply.status_code == 200, reply.text
        assert (await client.get("/health/ready")).json()["status"] == "ready"
        assert (await client.post("/v1/messages", json=CLAUDE, headers=claude)).status_code == 200
