"""HTTP surface of the gateway: the four provider protocols, plus session control (``session_routes``).

A model route hands the caller's key and a body reader to the call pipeline (``polar.proxy.call.service``) and
shapes only the response: JSON or SSE, with keep-alive bytes while a slow call runs. Every error leaves through
``_error``: the codec of the route turns a PolarError into its provider's status and body. Nothing reaches the
harness as a bare 500 traceback. Health: ``/health/live`` (the process answers), ``/health/ready`` (store
and backend each answer within ``health_timeout_s``; 503 otherwise), and ``/health`` (ready, plus details).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from polar import metrics
from polar.auth import announce, bearer_of, install_access_log_redaction, matches
from polar.errors import (
    AuthenticationError,
    BackendError,
    InvalidRequest,
    NotFound,
    PolarError,
    StoreError,
    retry_after,
)
from polar.proxy import access_log
from polar.proxy.gateway import Gateway
from polar.proxy.http import keepalive, ws_denial
from polar.proxy.http.admin import add_admin_routes
from polar.proxy.http.health import add_health_routes
from polar.proxy.http.session_routes import add_session_routes, api_key
from polar.proxy.http.stream_response import StreamResponse
from polar.slices import SlicedRequests
from polar.wire import ANTHROPIC, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES, ProtocolCodec
from polar.wire.body import FastJSONResponse, read_body

log = logging.getLogger(__name__)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error(codec: ProtocolCodec, exc: PolarError) -> JSONResponse:
    status, body = codec.error_response(exc)
    wait = retry_after(exc)
    headers = {"Retry-After": str(wait)} if wait is not None else None
    return FastJSONResponse(body, status_code=status, headers=headers)


def _codec_of_path(path: str) -> ProtocolCodec:
    """The protocol whose error shape a path's errors take: Google's under ``/v1beta``, Anthropic's under
    ``/v1/messages``, OpenAI's everywhere else (its routes, the session and admin routes, unknown paths)."""
    if path == "/v1beta" or path.startswith("/v1beta/"):
        return GEMINI
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    return OPENAI_CHAT


async def _frames_as_bytes(frames: AsyncIterator[str]) -> AsyncIterator[bytes]:
    async for frame in frames:
        yield frame.encode()


async def _run(fn: Callable[[], None]) -> None:
    """``fn()`` on the loop: a BackgroundTask runs a plain function in a worker thread (a thread hop per stream)."""
    fn()


def _internal(codec: ProtocolCodec, what: str) -> JSONResponse:
    """A bug, not the caller's fault: logged, and answered in the caller's protocol."""
    log.exception("unexpected error in %s", what)
    return _error(codec, PolarError("internal error in the gateway; see its log"))


async def _model_call(
    gw: Gateway, request: Request, codec: ProtocolCodec, *, model: str | None = None, stream: bool | None = None
) -> Response:
    try:
        plan = await gw.calls.receive(_key(request, codec), _reader(gw, request), codec, model=model, stream=stream)
        every_s = gw.settings.keepalive_s
        if not plan.request.stream:
            call = asyncio.create_task(gw.calls.complete(plan))
            if every_s <= 0 or await keepalive.first_within(call, every_s):
                return FastJSONResponse(await call)
            return StreamResponse(
                keepalive.padded_json(call, every_s, _json_bytes, partial(_error_bytes, codec)),
                media_type="application/json",
            )
        opening = asyncio.create_task(gw.calls.open_stream(plan))
        if every_s <= 0 or await keepalive.first_within(opening, every_s):
            frames, release = await opening
            return StreamResponse(
                _frames_as_bytes(frames),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
                background=BackgroundTask(_run, release),
            )

        async def frames_of(opened: tuple[AsyncIterator[str], Any]) -> AsyncIterator[bytes]:
            frames, release = opened
            try:
                async for frame in _frames_as_bytes(frames):
                    yield frame
            finally:
                release()

        def stream_error(exc: PolarError) -> list[bytes]:
            _count_failure(codec, exc)
            return [f.encode() for f in codec.stream_encoder(plan.meta, request=plan.request).error(exc)]

        return StreamResponse(
            keepalive.padded_stream(opening, every_s, frames_of, stream_error),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    except PolarError as exc:
        _count_failure(codec, exc)
        return _error(codec, exc)
    except Exception:  # noqa: BLE001 -- the last resort: an unexpected error is the caller's shaped 500, logged
        metrics.CALLS.labels(codec.name, "internal_error").inc()
        return _internal(codec, f"a {codec.name} call")


def _json_bytes(body: Any) -> bytes:
    return bytes(FastJSONResponse(body).body)


def _error_bytes(codec: ProtocolCodec, exc: PolarError) -> bytes:
    """A provider error body after keep-alive bytes (the 200 status is already out)."""
    _count_failure(codec, exc)
    return bytes(FastJSONResponse(codec.error_response(exc)[1]).body)


def _count_failure(codec: ProtocolCodec, exc: PolarError) -> None:
    metrics.CALLS.labels(codec.name, exc.error_type).inc()
    if isinstance(exc, StoreError):
        metrics.STORE_ERRORS.labels("gateway").inc()
    elif isinstance(exc, BackendError):
        metrics.BACKEND_ERRORS.labels(exc.error_type).inc()


def _key(request: Request, codec: ProtocolCodec) -> str | None:
    return api_key(request, query=codec.key_in_query)


def _reader(gw: Gateway, request: Request) -> Callable[[], Awaitable[bytes]]:
    """The body, read only when the call pipeline asks (once the caller's key was checked)."""
    return partial(read_body, request, gw.settings.max_body_bytes)


async def _count_tokens(gw: Gateway, request: Request, codec: ProtocolCodec, *, model: str | None = None) -> int:
    return await gw.calls.count_tokens(_key(request, codec), _reader(gw, request), codec, model=model)


def _control_error(exc: PolarError) -> JSONResponse:
    return _error(OPENAI_CHAT, exc)


def create_app(gw: Gateway) -> FastAPI:
    ws_denial.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with metrics.loop_lag_monitor("gateway"):
            yield
        await gw.aclose()

    app = FastAPI(title="Polar gateway", lifespan=lifespan)
    access_log.install(app, gw.settings)
    app.state.gateway = gw
    app.add_middleware(SlicedRequests)  # a burst of calls spreads over loop iterations
    control_token = announce(gw.settings)  # closed by default: generated on first start when none is set
    install_access_log_redaction()

    @app.exception_handler(StarletteHTTPException)
    async def unknown_route(request: Request, exc: StarletteHTTPException) -> Response:
        codec = _codec_of_path(request.url.path)
        if exc.status_code == 404:
            return _error(codec, NotFound(f"no such endpoint: {request.method} {request.url.path}", field="path"))
        error = PolarError(f"{request.method} {request.url.path}: {exc.detail}")
        error.status_code = exc.status_code
        error.error_type = "invalid_request_error"
        return _error(codec, error)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        return _error(_codec_of_path(request.url.path), InvalidRequest(f"invalid {field}: {first['msg']}", field=field))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _model_call(gw, request, OPENAI_CHAT)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await _model_call(gw, request, OPENAI_RESPONSES)

    @app.websocket("/v1/responses")
    async def responses_websocket(websocket: WebSocket) -> None:
        # Codex's built-in provider tries a WebSocket first. 426 Upgrade Required makes it fall back to HTTP
        # at once; a 403 (a plain close before accept) costs five retries with backoff (~7 s) first.
        _, body = OPENAI_RESPONSES.error_response(
            InvalidRequest("this gateway serves /v1/responses over HTTP POST only")
        )
        await ws_denial.deny(websocket, JSONResponse(body, status_code=426))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await _model_call(gw, request, ANTHROPIC)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            n = await _count_tokens(gw, request, ANTHROPIC)
        except PolarError as exc:
            return _error(ANTHROPIC, exc)
        except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
            return _internal(ANTHROPIC, "count_tokens")
        return JSONResponse({"input_tokens": n})

    @app.post("/v1beta/models/{target}")
    async def gemini(target: str, request: Request) -> Response:
        model, _, method = target.partition(":")
        if method in ("generateContent", "streamGenerateContent"):
            return await _model_call(gw, request, GEMINI, model=model, stream=method == "streamGenerateContent")
        if method == "countTokens":
            try:
                n = await _count_tokens(gw, request, GEMINI, model=model)
            except PolarError as exc:
                return _error(GEMINI, exc)
            except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
                return _internal(GEMINI, "countTokens")
            return JSONResponse({"totalTokens": n})
        return _error(
            GEMINI,
            NotFound(f"unknown method {method!r}; expected generateContent or streamGenerateContent", field="path"),
        )

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # a probe
    async def root() -> Response:
        return JSONResponse({"service": "polar-gateway", "status": "ok"})

    add_health_routes(app, gw)

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [{"id": gw.model_name, "object": "model", "owned_by": "polar"}]})

    authorize_control = add_session_routes(app, gw, control_token, _control_error, _internal)
    add_admin_routes(app, gw, authorize_control, _control_error)

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        """Prometheus text format (``polar.metrics``); the control token as Bearer, like every control route."""
        if not matches(bearer_of(request.headers.get("authorization")), control_token):
            return _control_error(AuthenticationError("this endpoint needs the control token as a Bearer token"))
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(Exception)
    async def last_resort(request: Request, exc: Exception) -> Response:
        # Reached only by a bug in a route without its own guard: still JSON in the OpenAI shape, not text.
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return _error(_codec_of_path(request.url.path), PolarError("internal error in the gateway; see its log"))

    return app
