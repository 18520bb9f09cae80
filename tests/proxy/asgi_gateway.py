"""A gateway served in-process over ASGI (no socket, no thread): fast enough for thousands of requests a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from polar.inference import Backend
from polar.proxy.gateway import Gateway
from polar.proxy.http.app import create_app
from polar.settings import Settings

CONTROL_TOKEN = "ctl-test-token"
CONTROL = {"Authorization": f"Bearer {CONTROL_TOKEN}"}


@asynccontextmanager
async def asgi_gateway(settings: Settings, backend: Backend) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    """The gateway and a client of it. App exceptions come back as responses (a 500 is then a visible failure)."""
    gw = await Gateway.create(settings.model_copy(update={"control_token": CONTROL_TOKEN}), backend=backend)
    transport = httpx.ASGITransport(app=create_app(gw), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            yield gw, client
    finally:
        await gw.aclose()


async def open_session(client: httpx.AsyncClient, **body: object) -> dict:
    reply = await client.post("/v1/sessions", json=body, headers=CONTROL)
    assert reply.status_code == 201, reply.text
    return reply.json()


async def captures(client: httpx.AsyncClient, session_id: str, *, requests: bool = False) -> list[dict]:
    reply = await client.get(f"/v1/sessions/{session_id}/captures", params={"requests": requests}, headers=CONTROL)
    assert reply.status_code == 200, reply.text
    return reply.json()["captures"]
