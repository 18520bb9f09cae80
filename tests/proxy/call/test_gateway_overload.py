"""Backpressure: with more calls than the inference server's in-flight bound, the excess waits up to the queue
deadline and then gets its provider's own overload error with ``Retry-After`` (never a 500 or a hang); the
gateway serves again at once. Nothing is recorded for a call that never reached the server."""

from __future__ import annotations

import asyncio

import pytest

from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem

BOUND = 2
# Each provider's own overload answer: status, and where its body names the kind.
OVERLOAD = {
    "openai_chat": (429, lambda b: b["error"]["code"] == "rate_limit_exceeded"),
    "openai_responses": (429, lambda b: b["error"]["code"] == "rate_limit_exceeded"),
    "anthropic": (529, lambda b: b["error"]["type"] == "overloaded_error"),
    "gemini": (503, lambda b: b["error"]["status"] == "UNAVAILABLE"),
}


class SlowBackend(LocalBackend):
    """The local engine, each generation held for ``delay_s`` first (a busy inference server); ``generate`` is
    the local backend's drained ``stream``, so both wait once."""

    delay_s = 1.0

    async def stream(self, request):
        await asyncio.sleep(self.delay_s)
        async for chunk in super().stream(request):
            yield chunk


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_three_times_the_bound_gets_overload_errors_then_recovers(stream, tmp_path, cache_dir, engine):
    settings = settings_for(tmp_path, cache_dir, backend_max_in_flight=BOUND, backend_queue_timeout_s=0.3)
    asyncio.run(_overload(settings, SlowBackend(engine), stream))


async def _overload(settings, backend, stream: bool) -> None:
    async with asgi_gateway(settings, backend) as (gw, client):
        session = await open_session(client)
        for name, protocol in PROTOCOLS.items():
            headers = protocol.headers(session["api_key"])

            async def call(protocol=protocol, headers=headers):
                return await client.post(protocol.url(stream), json=protocol.body(stream=stream), headers=headers)

            replies = await asyncio.wait_for(asyncio.gather(*(call() for _ in range(3 * BOUND))), 30)
            ok = [r for r in replies if r.status_code == 200]
            refused = [r for r in replies if r.status_code != 200]
            assert len(ok) == BOUND, [(r.status_code, r.text[:200]) for r in replies]
            status, is_overload = OVERLOAD[name]
            for reply in refused:
                assert reply.status_code == status, (name, reply.status_code, reply.text)
                assert error_problem(name, reply.status_code, reply.json()) is None, reply.text
                assert is_overload(reply.json()), reply.text
                assert int(reply.headers["retry-after"]) >= 1
            assert gw.calls.limit is not None and gw.calls.limit.in_flight == 0 and gw.calls.limit.queued == 0
            assert (await call()).status_code == 200  # recovered at once
        rows = await captures(client, session["session_id"])
        assert len(rows) == len(PROTOCOLS) * (BOUND + 1) and all(c["status"] == "OK" for c in rows)
