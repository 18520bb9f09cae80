"""HTTP surface of the gateway: the app, its routes registered from one table (``polar.proxy.http.routes``).

The table gives each route its handler, the protocol its errors are shaped in, and its access-log name. Every
error leaves through ``polar.proxy.http.errors`` in the route's protocol (a path no route serves: its neighbours'),
so nothing reaches the harness as a bare 500 traceback. Routes read the gateway and its session service from the
app (``served``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from polar import metrics
from polar.auth import announce, install_access_log_redaction
from polar.errors import InvalidRequest, NotFound, PolarError
from polar.proxy import access_log
from polar.proxy.gateway import Gateway
from polar.proxy.http import ws_denial
from polar.proxy.http.direct import DirectRoutes
from polar.proxy.http.errors import error_response, unhandled, upgrade_refused
from polar.proxy.http.route_table import AccessNames, Route, error_shape
from polar.proxy.http.routes import ROUTES
from polar.proxy.http.served import Served
from polar.proxy.session.service import SessionService
from polar.slices import SlicedRequests
from polar.wire import OPENAI_RESPONSES


def _endpoint(route: Route) -> Callable[[Request], Awaitable[Response]]:
    handler = route.handler

    async def endpoint(request: Request) -> Response:
        return await handler(request, route)

    endpoint.__name__ = handler.__name__
    return endpoint


async def _responses_websocket(websocket: WebSocket) -> None:
    # Codex's built-in provider tries a WebSocket first. 426 Upgrade Required makes it fall back to HTTP
    # at once; a 403 (a plain close before accept) costs five retries with backoff (~7 s) first.
    refusal = InvalidRequest("this gateway serves /v1/responses over HTTP POST only")
    await ws_denial.deny(websocket, upgrade_refused(OPENAI_RESPONSES, refusal))


def create_app(gw: Gateway) -> FastAPI:
    ws_denial.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with metrics.loop_lag_monitor("gateway"):
            yield
        await gw.aclose()

    app = FastAPI(title="Polar gateway", lifespan=lifespan)
    app.add_middleware(DirectRoutes, routes=ROUTES)  # the innermost: the access log and the slices come first
    access_log.install(app, gw.settings, AccessNames(ROUTES))
    app.add_middleware(SlicedRequests)  # a burst of calls spreads over loop iterations
    control_token = announce(gw.settings)  # closed by default: generated on first start when none is set
    install_access_log_redaction()
    sessions = SessionService(
        gw.sessions,
        gw.histories,
        gw.factory,
        control_token=control_token,
        capture_extras=gw.settings.capture_extras,
        store_timeout_s=gw.settings.store_statement_timeout_s,
    )
    app.state.gateway = gw
    app.state.served = Served(gw, sessions)

    @app.exception_handler(StarletteHTTPException)
    async def unknown_route(request: Request, exc: StarletteHTTPException) -> Response:
        codec = error_shape(ROUTES, request.url.path)
        if exc.status_code == 404:
            return error_response(
                codec, NotFound(f"no such endpoint: {request.method} {request.url.path}", field="path")
            )
        error = PolarError(f"{request.method} {request.url.path}: {exc.detail}")
        error.status_code = exc.status_code
        error.error_type = "invalid_request_error"
        return error_response(codec, error)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        error = InvalidRequest(f"invalid {field}: {first['msg']}", field=field)
        return error_response(error_shape(ROUTES, request.url.path), error)

    for route in ROUTES:
        app.add_api_route(route.path, _endpoint(route), methods=list(route.methods), include_in_schema=route.in_schema)
    app.add_api_websocket_route("/v1/responses", _responses_websocket)

    @app.exception_handler(Exception)
    async def last_resort(request: Request, exc: Exception) -> Response:
        # Reached only by a bug in a route without its own guard: still JSON in the route's shape, not text.
        return unhandled(error_shape(ROUTES, request.url.path), f"{request.method} {request.url.path}", exc)

    return app
