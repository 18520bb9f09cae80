"""``polar serve``: the control API on ``POLAR_API_HOST:POLAR_API_PORT``.

In the embedded default (no ``POLAR_GATEWAY_URL``, inline dispatch) this process also hosts the gateway the
rollouts call and runs their flows; new weights are pushed to that gateway. With a Prefect server configured
the tasks become deployment flow runs, and weights go to ``POLAR_WEIGHT_TARGETS`` (or ``POLAR_GATEWAY_URL``).
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from polar.api.app import create_api
from polar.api.runner import InlineDispatch, resolve_dispatch
from polar.auth import control_token, where
from polar.httpserve.header_timeout import with_header_timeout
from polar.rollout.context import GatewayStarter, rollout_context, store_factory
from polar.settings import Settings, TaskDispatch, get_settings


def build_app(
    settings: Settings | None = None,
    run_inline: InlineDispatch | None = None,
    start_gateway: GatewayStarter | None = None,
) -> FastAPI:
    """The control API; with inline dispatch, the rollout context the inline flows share is built first (its
    gateway started with ``start_gateway`` when ``POLAR_GATEWAY_URL`` is empty), so weights reach that gateway."""
    settings = settings or get_settings()
    gateway_url = settings.gateway_url or None
    if resolve_dispatch(settings) is TaskDispatch.INLINE:
        gateway_url = rollout_context(settings, start_gateway=start_gateway).gateway.url
    return create_api(settings, store_factory(settings), gateway_url=gateway_url, run_inline=run_inline)


def serve(
    *,
    host: str | None = None,
    port: int | None = None,
    run_inline: InlineDispatch | None = None,
    start_gateway: GatewayStarter | None = None,
) -> None:
    """Serve until interrupted, with the process-wide settings (the same ones the inline rollout flows read)."""
    settings = get_settings()
    control_token(settings)  # generated on first start when none is configured
    print(f"polar serve: /v1 routes need the control token from {where(settings)}", flush=True)
    config = api_config(build_app(settings, run_inline, start_gateway), settings, host=host, port=port)
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise SystemExit(3)  # as uvicorn.run exits when the server could not start (its port taken)


def api_config(app: FastAPI, settings: Settings, *, host: str | None = None, port: int | None = None) -> uvicorn.Config:
    """``polar serve``'s HTTP server: a connection that has not sent whole request headers within
    ``POLAR_HEADER_TIMEOUT_S`` is closed (``polar.httpserve.header_timeout``)."""
    return uvicorn.Config(
        app,
        host=host or settings.api_host,
        port=port or settings.api_port,
        log_level="info",
        http=with_header_timeout(settings.header_timeout_s),
        # Not uvloop: an inline flow swaps SIGTERM's handler for Prefect's, which raises TerminationSignal, and
        # uvloop swallows an exception raised by a signal handler (the process then ignored SIGTERM). On asyncio's
        # loop it unwinds this call, so what the process started (Prefect's temporary server, harnesses) stops.
        loop="asyncio",
    )
