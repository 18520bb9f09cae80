"""An HTTP server with SGLang's native wire format over the in-process LocalEngine.

``create_app`` serves the surface of SGLang's HTTP server that RL trainers and the gateway use:
``/generate`` (POST or PUT; JSON or SSE), ``/model_info``, ``/health``, ``/health_generate``,
``/v1/models``, ``/update_weights_from_disk``, ``/update_weight_version``, ``/pause_generation``,
``/continue_generation``, ``/flush_cache``, ``/abort_request``, ``/tokenize`` and ``/detokenize``; the control
routes (weights, pause, cache, abort) are in ``polar.serving.sglang_control``, what all routes share in
``polar.serving.sglang_state``.

Batch requests (lists of prompts, ``n > 1``) are answered 400 "batch requests are not supported by this
server". Every :class:`PolarError` is mapped to ``{"error": {"message", "type", "code"}}`` with its status
code in one exception handler; errors after a stream started arrive as an SSE ``error`` event. A client
that disconnects stops its generation (stream or not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from polar.errors import PolarError
from polar.models.engine import LocalEngine
from polar.serving.sglang_control import router as control_router
from polar.serving.sglang_render import error_json, stream_error_json
from polar.serving.sglang_run import GenerationRun
from polar.serving.sglang_state import ServerState, read_json, server_state
from polar.serving.sglang_wire import (
    DetokenizeBody,
    TokenizeBody,
    parse_body,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT default


class _ClosingStreamingResponse(StreamingResponse):
    """Closes its body iterator however the response ends, then calls ``on_close``.

    Starlette cancels the sending task on disconnect, which can leave the generator suspended at a
    ``yield`` until garbage collection; closing it here makes the engine drop the job at once.
    """

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], object], media_type: str):
        super().__init__(content, media_type=media_type)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._content.aclose()  # type: ignore[attr-defined]
            finally:
                self._on_close()


def create_app(
    engine: LocalEngine,
    *,
    served_model_name: str,
    incremental_streaming: bool = False,
    enable_return_routed_experts: bool = False,
) -> FastAPI:
    """The SGLang-compatible app over ``engine`` (which the caller owns and closes). Like SGLang, routed experts
    are returned only with ``enable_return_routed_experts`` (a request's ``return_routed_experts`` is otherwise
    silently left unanswered)."""
    app = FastAPI(title="polar serve-model (SGLang wire format)", openapi_url=None)
    app.state.sglang = ServerState(engine, served_model_name, incremental_streaming, enable_return_routed_experts)
    # One mapping for every error; Starlette needs it registered for Exception too (its 500 path).
    app.add_exception_handler(PolarError, _error_response)
    app.add_exception_handler(Exception, _error_response)
    app.include_router(router)
    app.include_router(control_router)
    return app


router = APIRouter()


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    state = server_state(request)
    run = state.new_run(await read_json(request))
    # Registered before the response starts, so a second request with the same rid is refused.
    state.runs[run.rid] = run
    if run.prepared.stream:
        forget = lambda: state.runs.pop(run.rid, None)  # noqa: E731
        return _ClosingStreamingResponse(_sse(run), on_close=forget, media_type="text/event-stream")
    try:
        body = await _unless_disconnected(request, run.response())
    finally:
        state.runs.pop(run.rid, None)
    if body is None:
        return Response(status_code=499)  # nobody is listening any more
    return JSONResponse(body)


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    state = server_state(request)
    engine = state.engine
    config = engine.model.config
    return {
        "model_path": str(engine.model_dir),
        "tokenizer_path": str(engine.model_dir),  # the model folder ships its tokenizer.json
        "served_model_name": state.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": engine.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": config.model_type,
        "architectures": list(config.architectures or []),
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "max_context_length": engine.context_length,
        "vocab_size": config.vocab_size,
        "eos_token_ids": sorted(engine.tokenizer.eos_ids),
    }


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    state = server_state(request)
    engine = state.engine
    if engine.paused:
        return Response(status_code=200)  # a paused engine is healthy; generating would just wait
    probe = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    run = state.new_run(probe)
    try:
        await asyncio.wait_for(run.response(), HEALTH_GENERATE_TIMEOUT_S)
    except TimeoutError:
        return Response(status_code=503)
    return Response(status_code=200)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = server_state(request)
    engine = state.engine
    name = state.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "max_model_len": engine.context_length,
    }
    return {"object": "list", "data": [card]}


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    engine = server_state(request).engine
    body = parse_body(await read_json(request), TokenizeBody)
    if isinstance(body.prompt, str):
        tokens: list[int] | list[list[int]] = engine.tokenizer.encode(body.prompt)
        count: int | list[int] = len(tokens)
    else:
        tokens = [list(ids) for ids in engine.tokenizer.encode_batch(body.prompt)]
        count = [len(t) for t in tokens]
    return {"tokens": tokens, "count": count, "max_model_len": engine.context_length}


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    engine = server_state(request).engine
    body = parse_body(await read_json(request), DetokenizeBody)
    skip = body.skip_special_tokens
    if body.tokens and isinstance(body.tokens[0], list):
        return {"text": [engine.tokenizer.decode(t, skip_special_tokens=skip) for t in body.tokens]}
    return {"text": engine.tokenizer.decode(body.tokens, skip_special_tokens=skip)}  # type: ignore[arg-type]


async def _error_response(request: Request, exc: Exception) -> JSONResponse:
    """Every error before output starts: ``{"error": {message, type, code}}`` with the error's status."""
    if not isinstance(exc, PolarError):
        logger.error("unhandled error on %s", request.url.path, exc_info=exc)
        exc = PolarError(f"internal error: {type(exc).__name__}: {exc}")
    return JSONResponse(error_json(exc), status_code=exc.status_code)


async def _sse(run: GenerationRun) -> AsyncIterator[bytes]:
    """SGLang's SSE framing: ``data: {json}`` per chunk, an error event if one happens, then ``[DONE]``."""
    try:
        async for chunk in run.chunks():
            yield _event(chunk)
    except PolarError as exc:
        yield _event(stream_error_json(exc))
    except Exception as exc:  # the stream is already 200: the error can only travel as an event
        logger.exception("generation %s failed mid-stream", run.rid)
        yield _event(stream_error_json(PolarError(f"internal error: {type(exc).__name__}: {exc}")))
    yield b"data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``, cancelling it (and so the engine job) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    return task.result() if not task.cancelled() else None


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next receive() only returns once the client disconnects.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def serve(
    host: str,
    port: int,
    engine: LocalEngine,
    *,
    served_model_name: str,
    incremental_streaming: bool = False,
    enable_return_routed_experts: bool = False,
    log_level: str = "info",
) -> None:
    """Serve ``create_app(engine, ...)`` with uvicorn until interrupted (blocks)."""
    app = create_app(
        engine,
        served_model_name=served_model_name,
        incremental_streaming=incremental_streaming,
        enable_return_routed_experts=enable_return_routed_experts,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
