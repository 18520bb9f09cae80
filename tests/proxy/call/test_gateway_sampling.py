"""What the gateway asks the engine for: the chat format's stop ids with every generation, and ``max_tokens``
clamped to what the context window leaves after the prompt (absent: the default)."""

from __future__ import annotations

import asyncio

from polar.backends.local import LocalBackend
from polar.inference import GenerateRequest
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for


class RecordingBackend(LocalBackend):
    """The local engine, keeping every request it is asked for."""

    def __init__(self, engine):
        super().__init__(engine)
        self.requests: list[GenerateRequest] = []

    def stream(self, request: GenerateRequest):
        self.requests.append(request)
        return super().stream(request)


def test_stop_ids_go_with_every_generation_and_max_tokens_is_clamped(tmp_path, cache_dir, engine):
    asyncio.run(_scenario(settings_for(tmp_path, cache_dir, default_max_tokens=7), engine))


async def _scenario(settings, engine) -> None:
    backend = RecordingBackend(engine)
    async with asgi_gateway(settings, backend) as (gw, client):
        session = await open_session(client)
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        hi = [{"role": "user", "content": "hi"}]

        async def call(**body) -> None:
            reply = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "messages": hi, **body}, headers=headers
            )
            assert reply.status_code == 200, reply.text

        family = set(gw.chat_format.stop_ids)
        assert family  # the format's end-of-turn ids
        await call(max_tokens=3)
        await call(max_tokens=10**6, stream=True)
        await call()
        await call(max_tokens=2)
        sent = [r.sampling for r in backend.requests]
        assert all(family <= set(s.stop_token_ids) for s in sent)
        prompt = len(backend.requests[1].input_ids)
        assert [s.max_new_tokens for s in sent] == [3, gw.calls.context_length - prompt, 7, 2]
