"""The model calls are served straight from the route table (``polar.proxy.http.direct``): FastAPI's router never
sees one, in any of the four protocols, while every other route, a model route's other methods and an unknown
path still go through it (and answer as they did)."""

from __future__ import annotations

import asyncio

from starlette.routing import Router

from polar.backends.local import LocalBackend
from polar.proxy.http.route_table import RouteLookup
from polar.proxy.http.routes import ROUTES
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": "ok"}]}
CALLS = [
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "tiny", "input": "hi"}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1beta/models/tiny:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
]


def test_model_calls_never_reach_fastapis_router(tmp_path, cache_dir, engine, monkeypatch):
    routed: list[str] = []
    route = Router.__call__

    async def counted(self, scope, receive, send):
        routed.append(f"{scope['method']} {scope['path']}")
        await route(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", counted)
    asyncio.run(_calls(settings_for(tmp_path, cache_dir), engine, routed))


async def _calls(settings, engine, routed: list[str]) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_, client):
        session = await open_session(client, policy=SCRIPT)
        key = session["api_key"]
        headers = {"Authorization": f"Bearer {key}", "x-api-key": key, "x-goog-api-key": key}
        routed.clear()
        for path, body in CALLS:
            reply = await client.post(path, json=body, headers=headers)
            assert reply.status_code == 200, (path, reply.text)
        assert routed == []
        assert (await client.get("/v1/chat/completions")).status_code == 405  # another method: FastAPI's answer
        assert (await client.post("/v1/nothing", json={})).status_code == 404
        assert (await client.get("/health/live")).status_code == 200
        assert routed == ["GET /v1/chat/completions", "POST /v1/nothing", "GET /health/live"]


def test_a_lookup_finds_fixed_and_templated_paths_by_method():
    lookup = RouteLookup(ROUTES)
    found = lookup.find("POST", "/v1beta/models/tiny:generateContent")
    assert found is not None and found[1] == {"target": "tiny:generateContent"}
    found = lookup.find("POST", "/v1/chat/completions")
    assert found is not None and found[0].direct and found[1] == {}
    assert lookup.find("GET", "/v1/chat/completions") is None
    assert lookup.find("POST", "/v1/chat/completions/") is None
