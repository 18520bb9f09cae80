"""The gateway's intake: the key is checked before the body is read (an unauthenticated body is never parsed, and
one that never ends is not waited for), and every path under ``/v1beta`` answers in Google's error shape, known
or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem

COUNT_PATHS = {"anthropic": "/v1/messages/count_tokens", "gemini": "/v1beta/models/tiny:countTokens"}


def test_the_key_is_checked_before_the_body_is_read(tmp_path, cache_dir, engine):
    asyncio.run(_auth_first(settings_for(tmp_path, cache_dir, default_max_tokens=2), engine))


async def _endless() -> AsyncIterator[bytes]:
    yield b'{"model": "tiny", "messages": ['
    await asyncio.sleep(3600)  # a body that never ends: reading it would hang the call
    yield b"]}"


async def _auth_first(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        valid = (await open_session(client))["api_key"]
        for protocol in PROTOCOLS.values():
            paths = [protocol.url(False), *([COUNT_PATHS[protocol.name]] if protocol.name in COUNT_PATHS else [])]
            for path in paths:
                for key in (None, "sk-polar-not-a-session"):
                    headers = {"content-type": "application/json", **(protocol.headers(key) if key else {})}
                    # not JSON at all: a 401, not a 400 (the body was never parsed)
                    reply = await client.post(path, content=b"{not json", headers=headers)
                    assert reply.status_code == 401, f"{path}: {reply.status_code} {reply.text}"
                    assert error_problem(protocol.name, 401, reply.json()) is None, reply.text
                    reply = await asyncio.wait_for(client.post(path, content=_endless(), headers=headers), 30)
                    assert reply.status_code == 401, f"{path}: {reply.status_code} {reply.text}"
            # a valid key still gets the body's own error
            reply = await client.post(
                protocol.url(False), content=b"{not json", headers=protocol.headers(valid) | {"content-type": "x"}
            )
            assert reply.status_code == 400 and "json" in reply.text.lower(), reply.text


def test_every_v1beta_path_answers_in_googles_shape(tmp_path, cache_dir, engine):
    asyncio.run(_google_paths(settings_for(tmp_path, cache_dir), engine))


async def _google_paths(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        key = (await open_session(client))["api_key"]
        headers = {"x-goog-api-key": key}
        requests = [
            ("GET", "/v1beta/models", 404),
            ("GET", "/v1beta", 404),
            ("POST", "/v1beta/files", 404),
            ("POST", "/v1beta/models/tiny/extra:generateContent", 404),
            ("POST", "/v1beta/models/tiny:embedContent", 404),
            ("GET", "/v1beta/models/tiny:generateContent", 405),
            ("DELETE", "/v1beta/models/tiny:streamGenerateContent", 405),
        ]
        for method, path, status in requests:
            reply = await client.request(method, path, headers=headers)
            assert reply.status_code == status, f"{method} {path}: {reply.status_code} {reply.text}"
            assert error_problem("gemini", status, reply.json()) is None, f"{method} {path}: {reply.text}"
        # Anthropic's paths answer in Anthropic's shape, everything else in OpenAI's
        reply = await client.get("/v1/messages/batches")
        assert reply.status_code in (404, 405) and error_problem("anthropic", reply.status_code, reply.json()) is None
        reply = await client.get("/v2/nothing")
        assert reply.status_code == 404 and error_problem("openai_chat", 404, reply.json()) is None
