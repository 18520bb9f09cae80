"""A client that leaves in the middle of a stream stops its generation: the backend's stream is closed (an
inference server then aborts the request) and the call's in-flight slot is free again at once."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx

from polar.backends.local import LocalBackend
from tests.proxy.gateway_server import GatewayServer, settings_for


class DrippingBackend(LocalBackend):
    """The local engine, one token every 0.1 s and never its end-of-sequence: a stream of 200 tokens lasts 20 s."""

    def __init__(self, engine):
        super().__init__(engine)
        self.open_streams = 0
        self.closed_early = 0

    async def stream(self, request):
        sampling = request.sampling.model_copy(update={"ignore_eos": True, "stop_token_ids": ()})
        self.open_streams += 1
        finished = False
        try:
            async for chunk in super().stream(dataclasses.replace(request, sampling=sampling)):
                await asyncio.sleep(0.1)
                yield chunk
            finished = True
        finally:
            self.open_streams -= 1
            self.closed_early += not finished


def test_a_client_leaving_mid_stream_stops_the_generation_and_frees_its_slot(tmp_path, cache_dir, engine):
    backend = DrippingBackend(engine)
    settings = settings_for(tmp_path, cache_dir, backend_max_in_flight=4)
    with GatewayServer(settings, backend=backend) as gateway:
        session = httpx.post(gateway.url + "/v1/sessions", json={}, headers=gateway.control).json()
        body = {"model": "tiny", "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=headers) as reply:
            assert reply.status_code == 200
            # The stream is under way; the client hangs up when the block ends. The iterator is kept: a generator
            # dropped after one item is closed at once, and its connection with it (the client had left already).
            chunks = reply.iter_raw()
            first = next(chunks)
            assert first.startswith(b"data: ")
            started = time.monotonic()  # the first event can precede the backend's stream: wait until it is open
            while backend.open_streams != 1 and time.monotonic() - started < 15:
                time.sleep(0.02)
            assert backend.open_streams == 1
        left = time.monotonic()
        while (backend.open_streams or gateway.gateway.calls.limit.in_flight) and time.monotonic() - left < 5:
            time.sleep(0.02)
        assert backend.open_streams == 0 and backend.closed_early == 1
        assert time.monotonic() - left < 2  # not when the 20 s generation would have ended
        assert gateway.gateway.calls.limit.in_flight == 0
