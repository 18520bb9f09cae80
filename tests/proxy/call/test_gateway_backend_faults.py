"""Impossible backend output is an in-protocol error and an ERROR capture, streamed or not, never stored as OK.

The backend is a fake SGLang server (real HTTP, SGLang's /generate wire format) that injects one fault per case:
negative and out-of-vocabulary ids, more tokens than allowed, a NaN logprob, and stalls before and during a
stream. The gateway talks to it through the real ``sglang`` client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from polar.backends.sglang import SGLangBackend
from polar.serving.threaded import ServerThread
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.fault_sglang import INFO, fault_sglang, meta_info
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem, stream_outcome

STALL_S = 30.0  # far past the gateway's stall deadline below
STALL_DEADLINE_S = 1.0
# Output faults answer at once; their deadline only has to outlast validating 5,001 ids on a loaded machine.
OUTPUT_DEADLINE_S = 20.0

# fault -> (output ids given the allowed count, logprob of the last id, expected words in the error)
FAULTS: dict[str, tuple[Any, float, str]] = {
    "negative_id": (lambda n: [100, -3], -0.5, "-3"),
    "out_of_vocabulary": (lambda n: [100, 999_999], -0.5, "vocabulary"),
    "too_many_tokens": (lambda n: [100] * 5001, -0.5, "5001"),
    "nan_logprob": (lambda n: [100, 101], float("nan"), "logprob"),
    "positive_logprob": (lambda n: [100, 101], 3.0, "logprob"),
    "stall": (None, 0.0, "within"),
    "stall_mid_stream": (None, 0.0, "within"),
}


def _meta(ids: list[int], last_logprob: float, finished: bool) -> dict[str, Any]:
    """Every logprob -0.5 but the last one's."""
    logprobs = [[-0.5, i, None] for i in ids]
    if logprobs:
        logprobs[-1][0] = last_logprob
    return meta_info(ids, final=finished, output_token_logprobs=logprobs)


def faulty_sglang() -> FastAPI:
    return fault_sglang(_answer, "negative_id")


async def _answer(body: dict[str, Any], fault: str) -> Response:
    make, last, _ = FAULTS[fault]
    if fault == "stall" or (fault == "stall_mid_stream" and not body["stream"]):
        await asyncio.sleep(STALL_S)
    ids = [100, 101] if make is None else make(body["sampling_params"]["max_new_tokens"])
    if not body["stream"]:
        # allow_nan: Python's json (as SGLang's server uses) writes NaN as the bare token NaN
        payload = {"text": "", "output_ids": ids, "meta_info": _meta(ids, last, True)}
        return Response(json.dumps(payload), media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        first = ids[:1]
        yield (
            b"data: "
            + json.dumps({"text": "", "output_ids": first, "meta_info": _meta(first, -0.5, False)}).encode()
            + b"\n\n"
        )
        if fault == "stall_mid_stream":
            await asyncio.sleep(STALL_S)
        # cumulative chunks, SGLang's default
        yield (
            b"data: "
            + json.dumps({"text": "", "output_ids": ids, "meta_info": _meta(ids, last, True)}).encode()
            + b"\n\n"
        )
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FastAPI]]:
    app = faulty_sglang()
    with ServerThread(app) as server:
        yield server.url, app


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("stalls", [False, True], ids=["output", "stalls"])
def test_backend_faults_are_errors_with_error_captures(tmp_path, cache_dir, fake, stream, stalls):
    url, app = fake
    deadline = STALL_DEADLINE_S if stalls else OUTPUT_DEADLINE_S
    settings = settings_for(tmp_path, cache_dir, backend_deadline_s=deadline)
    faults = [fault for fault in FAULTS if fault.startswith("stall") == stalls]
    asyncio.run(_faults(settings, url, app, stream, faults))


async def _faults(settings, url: str, app: FastAPI, stream: bool, faults: list[str]) -> None:
    backend = SGLangBackend(url, model_info=INFO, timeout_s=60.0)
    try:
        async with asgi_gateway(settings, backend) as (_gw, client):
            for fault in faults:
                words = FAULTS[fault][2]
                app.state.fault = fault
                for protocol in PROTOCOLS.values():
                    session = await open_session(client)
                    reply = await client.post(
                        protocol.url(stream),
                        json=protocol.body(stream=stream, max_tokens=32),
                        headers=protocol.headers(session["api_key"]),
                    )
                    where = f"{fault} / {protocol.name} / stream={stream}"
                    if reply.status_code == 200:
                        assert stream, f"{where}: a non-streamed fault answered 200: {reply.text:.300}"
                        assert stream_outcome(protocol.name, reply.text) == "error", f"{where}: {reply.text:.500}"
                        assert words.lower() in reply.text.lower(), f"{where}: {reply.text:.500}"
                    else:
                        assert reply.status_code in (502, 504), f"{where}: {reply.status_code} {reply.text:.300}"
                        assert error_problem(protocol.name, reply.status_code, reply.json()) is None, where
                        # a stall past the deadline (504) is retryable and says when; a protocol error (502) is not
                        retry = reply.headers.get("retry-after")
                        assert retry == ("1" if reply.status_code == 504 else None), f"{where}: Retry-After {retry}"
                        assert words.lower() in reply.text.lower(), f"{where}: {reply.text:.300}"
                    rows = await captures(client, session["session_id"])
                    assert [row["status"] for row in rows] == ["ERROR"], f"{where}: {rows}"
                    assert words.lower() in rows[0]["error"].lower(), f"{where}: {rows[0]['error']}"
    finally:
        await backend.aclose()


def test_health_with_the_backend_down_is_shaped_not_ready(tmp_path, cache_dir):
    from tests.proxy.gateway_server import free_port

    asyncio.run(_backend_down(settings_for(tmp_path, cache_dir, health_timeout_s=1.0), free_port()))


async def _backend_down(settings, port: int) -> None:
    backend = SGLangBackend(f"http://127.0.0.1:{port}", model_info=INFO, timeout_s=5.0)  # nothing listens there
    try:
        async with asgi_gateway(settings, backend) as (_gw, client):
            for path in ("/health/ready", "/health"):
                reply = await client.get(path)
                assert reply.status_code == 503, reply.text
                assert reply.headers["retry-after"] == "1"
                body = reply.json()
                assert body["checks"]["backend"]["ok"] is False and body["checks"]["store"]["ok"] is True
                assert "backend" in body["error"]["message"]
            assert (await client.get("/health/live")).status_code == 200
            session = await open_session(client)
            for protocol in PROTOCOLS.values():
                reply = await client.post(
                    protocol.url(False), json=protocol.body(), headers=protocol.headers(session["api_key"])
                )
                assert reply.status_code == 503 and error_problem(protocol.name, 503, reply.json()) is None
                assert reply.headers["retry-after"] == "1", protocol.name  # every retryable 5xx says when
    finally:
        await backend.aclose()
