"""Every backend value that reaches a capture, a header or a metric is checked: a bad one is a backend protocol
error in the caller's protocol (an error event once a stream has begun) and an ERROR capture, never a 500 and
never an OK capture, and the session's capture listing still answers.

The backend is a fake SGLang server (real HTTP on 127.0.0.1, SGLang's ``/generate`` wire format) that injects one
fault per case, for the four protocols, streamed and not; the gateway talks to it through the real ``sglang``
client. (``test_gateway_backend_faults`` covers impossible ids, logprobs and stalls.)
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

IDS = [100, 101]


def _chunk(ids: list[int], *, final: bool = True, **changes: Any) -> dict[str, Any]:
    return {"text": "", "output_ids": ids, "meta_info": meta_info(ids, final=final, **changes)}


def _event(payload: Any) -> bytes:
    # Python's json (as SGLang's server uses) writes NaN and Infinity as bare tokens
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _version(version: str) -> dict[str, Any]:
    return {"weight_version": version, "weight_versions": [{"version": version, "start": 0, "end": len(IDS)}]}


def _bad_final(**changes: Any) -> tuple[list[bytes], bytes]:
    """A stream whose first chunk is fine and whose final chunk carries ``changes``; a body with them."""
    writes = [_event(_chunk(IDS[:1], final=False)), _event(_chunk(IDS, **changes)), b"data: [DONE]\n\n"]
    return writes, json.dumps(_chunk(IDS, **changes)).encode()


def _logprob_false() -> dict[str, Any]:
    return {"output_token_logprobs": [[-0.5, IDS[0], None], [False, IDS[1], None]]}


# fault -> (stream writes, non-streamed body, words of which the error names one)
FAULTS: dict[str, tuple[list[bytes], bytes, tuple[str, ...]]] = {
    "e2e_latency_nan": (*_bad_final(e2e_latency=float("nan")), ("e2e_latency",)),
    "e2e_latency_infinity": (*_bad_final(e2e_latency=float("inf")), ("e2e_latency",)),
    "e2e_latency_negative": (*_bad_final(e2e_latency=-5), ("e2e_latency",)),
    "span_end_infinity": (
        *_bad_final(weight_versions=[{"version": "w0", "start": 0, "end": float("inf")}]),
        ("weight_versions",),
    ),
    "event_null_alone": ([b"data: null\n\n", b"data: [DONE]\n\n"], b"null", ("object",)),
    "event_number_alone": ([b"data: 5\n\n", b"data: [DONE]\n\n"], b"5", ("object",)),
    "event_null_batched": (
        [_event(_chunk(IDS[:1], final=False)) + b"data: null\n\n" + _event(_chunk(IDS)), b"data: [DONE]\n\n"],
        b"[null]",
        ("object",),
    ),
    "event_number_batched": (
        [b"data: 5\n\n" + _event(_chunk(IDS)), b"data: [DONE]\n\n"],
        b'"5"',
        ("object",),
    ),
    "weight_version_129_chars": (*_bad_final(**_version("v" * 129)), ("weight version",)),
    "weight_version_nul": (*_bad_final(**_version("w\x00")), ("weight version",)),
    "weight_version_not_string": (*_bad_final(weight_versions=[{"version": 7, "start": 0, "end": 2}]), ("weight",)),
    "logprob_false": (*_bad_final(**_logprob_false()), ("logprob",)),
    "stop_id_out_of_range": (*_bad_final(finish_reason={"type": "stop", "matched": 10**12}), ("stop token",)),
    "prompt_tokens_negative": (*_bad_final(prompt_tokens=-1), ("prompt_tokens",)),
    "tokens_after_final": (
        [_event(_chunk(IDS)), _event(_chunk([*IDS, 102])), b"data: [DONE]\n\n"],
        json.dumps(_chunk(IDS)).encode() + json.dumps(_chunk([*IDS, 102])).encode(),
        ("after", "json"),
    ),
    "tokens_after_final_batched": (
        [_event(_chunk(IDS[:1], final=False)) + _event(_chunk(IDS)) + _event(_chunk([*IDS, 102]))],
        json.dumps(_chunk(IDS)).encode() + b"\n" + json.dumps(_chunk([*IDS, 102])).encode(),
        ("after", "json"),
    ),
}


def faulty_sglang() -> FastAPI:
    return fault_sglang(_answer, "e2e_latency_nan")


async def _answer(body: dict[str, Any], fault: str) -> Response:
    writes, plain, _ = FAULTS[fault]
    if not body["stream"]:
        return Response(plain, media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        for write in writes:
            yield write
            await asyncio.sleep(0.01)  # separate writes arrive in separate reads

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FastAPI]]:
    app = faulty_sglang()
    with ServerThread(app) as server:
        yield server.url, app


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_bad_backend_values_are_protocol_errors_with_error_captures(tmp_path, cache_dir, fake, stream):
    url, app = fake
    settings = settings_for(tmp_path, cache_dir, backend_deadline_s=20.0)
    asyncio.run(_faults(settings, url, app, stream))


async def _faults(settings, url: str, app: FastAPI, stream: bool) -> None:
    backend = SGLangBackend(url, model_info=INFO, timeout_s=30.0)
    problems: list[str] = []
    try:
        async with asgi_gateway(settings, backend) as (_gw, client):
            for fault, (_, _, words) in FAULTS.items():
                app.state.fault = fault
                for protocol in PROTOCOLS.values():
                    session = await open_session(client)
                    reply = await client.post(
                        protocol.url(stream),
                        json=protocol.body(stream=stream, max_tokens=32),
                        headers=protocol.headers(session["api_key"]),
                    )
                    where = f"{fault} / {protocol.name} / stream={stream}"
                    named = any(word in reply.text.lower() for word in words)
                    if reply.status_code == 200:
                        if not stream or stream_outcome(protocol.name, reply.text) != "error" or not named:
                            problems.append(f"{where}: 200 {reply.text[-400:]}")
                    elif reply.status_code != 502 or error_problem(protocol.name, 502, reply.json()) or not named:
                        problems.append(f"{where}: {reply.status_code} {reply.text[:400]}")
                    rows = await captures(client, session["session_id"])  # the listing answers (200)
                    if [row["status"] for row in rows] != ["ERROR"] or "backend_protocol_error" not in rows[0]["error"]:
                        problems.append(f"{where}: captures {[(r['status'], r['error']) for r in rows]}")
    finally:
        await backend.aclose()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
