"""The sglang client against servers that are down, slow, or answer outside SGLang's wire format.

The misbehaving server is a real HTTP server (FastAPI under uvicorn) whose answer is chosen per test.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from polar.backends.sglang import SGLangBackend
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    UnknownSamplingParameter,
)
from polar.inference import FinishReason, GenerateRequest, SamplingParams, VersionSpan, collect
from polar.serving.threaded import ServerThread

REQUEST = GenerateRequest((1, 2, 3), SamplingParams(max_new_tokens=2))
INFO = {"weight_version": "w", "max_context_length": 128}


def meta(ids: list[int], **override: Any) -> dict[str, Any]:
    info = {
        "id": "r",
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 3,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": "w",
        "weight_versions": [{"version": "w", "start": 0, "end": len(ids)}],
        "e2e_latency": 0.1,
        "output_token_logprobs": [[-0.5, i, None] for i in ids],
        "output_token_logprobs_length": len(ids),
    }
    info.update(override)
    return {key: value for key, value in info.items() if value is not ...}


def sse(*events: Any, gaps_s: tuple[float, ...] = ()) -> StreamingResponse:
    """``events`` as SSE, ``gaps_s[i]`` seconds after event i (the last gap repeats)."""

    async def body() -> AsyncIterator[bytes]:
        for i, event in enumerate(events):
            if i and gaps_s:
                await asyncio.sleep(gaps_s[min(i - 1, len(gaps_s) - 1)])
            yield b"data: " + (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


# name -> what /generate answers (non-stream and stream get the same answer unless it is SSE)
ANSWERS: dict[str, Any] = {
    "not_json": lambda: PlainTextResponse("<html>bad gateway</html>"),
    "no_meta": lambda: JSONResponse({"text": "", "output_ids": [7, 8]}),
    "ids_mismatch": lambda: JSONResponse(
        {
            "text": "",
            "output_ids": [7, 8],
            "meta_info": meta([7, 8], output_token_logprobs=[[-0.1, 7, None], [-0.2, 9, None]]),
        }
    ),
    "short_logprobs": lambda: JSONResponse(
        {"text": "", "output_ids": [7, 8], "meta_info": meta([7, 8], output_token_logprobs=[[-0.1, 7, None]])}
    ),
    "finish_string": lambda: JSONResponse(
        {"text": "", "output_ids": [7], "meta_info": meta([7], finish_reason="stop")}
    ),
    "spans_gap": lambda: JSONResponse(
        {
            "text": "",
            "output_ids": [7, 8],
            "meta_info": meta([7, 8], weight_versions=[{"version": "w", "start": 0, "end": 1}]),
        }
    ),
    "no_versions": lambda: JSONResponse(
        {"text": "", "output_ids": [7, 8], "meta_info": meta([7, 8], weight_versions=..., weight_version=...)}
    ),
    "only_weight_version": lambda: JSONResponse(
        {"text": "", "output_ids": [7, 8], "meta_info": meta([7, 8], weight_versions=...)}
    ),
    "abort": lambda: JSONResponse(
        {
            "text": "",
            "output_ids": [7],
            "meta_info": meta(
                [7], finish_reason={"type": "abort", "message": "x", "status_code": None, "err_type": None}
            ),
        }
    ),
    "sse_not_json": lambda: sse(b"{not json"),
    "sse_no_finish": lambda: sse(
        {"text": "", "output_ids": [7], "meta_info": meta([7], finish_reason=None)}, b"[DONE]"
    ),
    "sse_jumbled": lambda: sse(
        {"text": "", "output_ids": [7], "meta_info": meta([7], finish_reason=None)},
        {"text": "", "output_ids": [7, 8, 9], "meta_info": meta([7, 8, 9], completion_tokens=5)},
    ),
    # A stream going silent after its second token, and one whose tokens each come within the client's limit.
    "sse_stall": lambda: sse(
        *({"text": "", "output_ids": [7] * n, "meta_info": meta([7] * n, finish_reason=None)} for n in (1, 2)),
        {"text": "", "output_ids": [7] * 3, "meta_info": meta([7] * 3)},
        gaps_s=(0.1, 2.0),
    ),
    "sse_steady": lambda: sse(
        *({"text": "", "output_ids": [7] * n, "meta_info": meta([7] * n, finish_reason=None)} for n in range(1, 6)),
        {"text": "", "output_ids": [7] * 6, "meta_info": meta([7] * 6, finish_reason={"type": "length", "length": 6})},
        b"[DONE]",
        gaps_s=(0.2,),
    ),
    "sse_error": lambda: sse({"error": {"message": "scheduler crashed", "type": "x", "code": 500, "retryable": False}}),
    "unknown_field": lambda: JSONResponse(
        {"error": {"message": "JsonContractError: unknown field max_tokens, expected one of max_new_tokens, stop"}},
        status_code=400,
    ),
    "too_long": lambda: JSONResponse(
        {"error": {"message": "The input (200 tokens) is longer than the model's context length (128 tokens)."}},
        status_code=400,
    ),
    "plain_400": lambda: JSONResponse({"error": {"message": "top_p must be in (0, 1]"}}, status_code=400),
    "http_500": lambda: PlainTextResponse("Internal Server Error", status_code=500),
    "http_503": lambda: Response(status_code=503),
}


def fake_sglang() -> FastAPI:
    app = FastAPI()
    app.state.answer = "not_json"
    app.state.info = INFO

    @app.get("/model_info")
    async def model_info() -> Response:
        info = app.state.info
        return JSONResponse(info) if isinstance(info, dict) else PlainTextResponse(str(info))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "m"}]}

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        await request.body()
        if app.state.answer == "slow":
            await asyncio.sleep(1.0)  # twice the client's timeout
        return ANSWERS[app.state.answer]()

    return app


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FastAPI]]:
    app = fake_sglang()
    with ServerThread(app) as server:
        yield server.url, app


@pytest.fixture
async def backend(fake) -> AsyncIterator[SGLangBackend]:
    url, app = fake
    app.state.info = INFO
    client = await SGLangBackend.connect(url, timeout_s=30.0)
    yield client
    await client.aclose()


async def answer(fake, backend: SGLangBackend, name: str, *, stream: bool):
    fake[1].state.answer = name
    if stream:
        return await collect(backend.stream(REQUEST))
    return await backend.generate(REQUEST)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# §1 unreachable and slow ------------------------------------------------------------------------------------


async def test_closed_port_is_backend_unavailable_naming_the_url():
    url = closed_port_url()
    with pytest.raises(BackendUnavailable, match=url):
        await SGLangBackend.connect(url)
    backend = SGLangBackend(url, model_info=INFO)
    try:
        with pytest.raises(BackendUnavailable, match=url):
            await backend.generate(REQUEST)
        with pytest.raises(BackendUnavailable, match=url):
            await collect(backend.stream(REQUEST))
        with pytest.raises(BackendUnavailable, match=url):
            await backend.weight_version()
    finally:
        await backend.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
async def test_a_slow_server_times_out_as_unavailable(fake, stream):
    impatient = SGLangBackend(fake[0], timeout_s=0.5, model_info=INFO)
    try:
        with pytest.raises(BackendUnavailable, match="timed out"):
            await answer(fake, impatient, "slow", stream=stream)
    finally:
        await impatient.aclose()


async def test_a_stream_silent_past_the_limit_times_out_as_unavailable(fake):
    impatient = SGLangBackend(fake[0], timeout_s=0.5, model_info=INFO)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(BackendUnavailable, match="timed out"):
            await answer(fake, impatient, "sse_stall", stream=True)
        assert loop.time() - started < 1.5  # cut within the limit and a tick of silence, not at the 2 s token
        result = await answer(fake, impatient, "sse_steady", stream=True)  # 1.2 s long, never 0.5 s silent
        assert result.output_ids == (7,) * 6
    finally:
        await impatient.aclose()


# §2 answers outside the wire format --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("not_json", "did not answer JSON"),
        ("no_meta", "no meta_info"),
        ("ids_mismatch", "is for token 9 but output_ids[1] is 8"),
        ("short_logprobs", "1 output_token_logprobs for 2 output_ids"),
        ("finish_string", "finish_reason 'stop'"),
        ("spans_gap", "do not cover the 2 output tokens"),
        ("no_versions", "neither weight_versions nor weight_version"),
    ],
)
async def test_malformed_responses_are_protocol_errors(fake, backend, name, needle):
    with pytest.raises(BackendProtocolError, match=re.escape(needle)):
        await answer(fake, backend, name, stream=False)


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("sse_not_json", "stream event is not JSON"),
        ("sse_no_finish", "ended before a chunk with a finish_reason"),
        ("sse_jumbled", "fits neither cumulative nor incremental"),
        ("no_meta", "no meta_info"),  # a plain JSON body where SSE was expected
        ("not_json", "not a server-sent event line"),
    ],
)
async def test_malformed_streams_are_protocol_errors(fake, backend, name, needle):
    with pytest.raises(BackendProtocolError, match=re.escape(needle)):
        await answer(fake, backend, name, stream=True)


async def test_missing_context_length_or_bad_model_info_fails_connect(fake):
    url, app = fake
    app.state.info = {"weight_version": "w"}  # and /v1/models has no max_model_len either
    with pytest.raises(BackendProtocolError, match="context length"):
        await SGLangBackend.connect(url)
    app.state.info = "not json"
    with pytest.raises(BackendProtocolError, match="did not answer JSON"):
        await SGLangBackend.connect(url)


# §3 well-formed answers that are not successes ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
async def test_server_errors_keep_the_servers_message(fake, backend, stream):
    with pytest.raises(UnknownSamplingParameter, match="unknown field max_tokens") as unknown:
        await answer(fake, backend, "unknown_field", stream=stream)
    assert unknown.value.field == "sampling_params.max_tokens"
    with pytest.raises(ContextLengthExceeded, match=r"context length \(128 tokens\)") as long:
        await answer(fake, backend, "too_long", stream=stream)
    assert long.value.context_length == 128 and long.value.prompt_tokens == len(REQUEST.input_ids)
    with pytest.raises(InvalidRequest, match=r"top_p must be in \(0, 1\]"):
        await answer(fake, backend, "plain_400", stream=stream)
    with pytest.raises(BackendError, match="500") as failed:
        await answer(fake, backend, "http_500", stream=stream)
    assert not isinstance(failed.value, BackendUnavailable | BackendProtocolError)
    with pytest.raises(BackendUnavailable, match="503"):
        await answer(fake, backend, "http_503", stream=stream)


async def test_an_error_event_mid_stream_is_a_backend_error(fake, backend):
    with pytest.raises(BackendError, match="scheduler crashed"):
        await answer(fake, backend, "sse_error", stream=True)


async def test_abort_finish_is_a_result_and_a_lone_weight_version_is_one_span(fake, backend):
    aborted = await answer(fake, backend, "abort", stream=False)
    assert aborted.finish_reason is FinishReason.ABORT and aborted.output_ids == (7,)
    single = await answer(fake, backend, "only_weight_version", stream=False)
    assert single.version_spans == (VersionSpan("w", 0, 2),) and single.output_logprobs == (-0.5, -0.5)
