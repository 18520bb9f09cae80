"""The control API (``polar serve``): tasks, rollouts, trajectories, trainer claims and weight versions.

``create_api`` assembles it: the routes (``polar.api.routes``, one router per resource) with their dependencies
(``polar.api.deps``) and reply models (``polar.api.schemas``), the one place errors are shaped
(``polar.api.error_handlers``: ``{"error": {"type", "message", "field"}}``, request validation errors are 400s
naming the field), the body guard and the web UI. Every ``/v1`` route needs the control token (``polar.auth``:
``POLAR_CONTROL_TOKEN``, or the one generated in ``$POLAR_HOME/control-token``) as a Bearer token, checked before
a byte of the body is read, and every body is size-limited (``polar.api.guard``); store work waits at most
``POLAR_STORE_STATEMENT_TIMEOUT_S`` (then a 503 with ``Retry-After``). A background loop admits and starts
submitted tasks (``TaskRunner``) and delivers completion callbacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker

from polar import metrics
from polar.api.callbacks import deliver_due
from polar.api.deps import ApiState, Store
from polar.api.error_handlers import error_response, install_error_handlers
from polar.api.guard import api_screen
from polar.api.routes import ROUTERS
from polar.api.runner import InlineDispatch, TaskRunner
from polar.auth import announce, install_access_log_redaction
from polar.httpserve.guard import BodyGuard
from polar.settings import Settings
from polar.ui import install_ui

log = logging.getLogger(__name__)


def create_api(
    settings: Settings,
    factory: sessionmaker[Session],
    *,
    gateway_url: str | None = None,
    run_inline: InlineDispatch | None = None,
) -> FastAPI:
    """The app over the store ``factory``; ``gateway_url`` is the rollouts' gateway (default weight target);
    ``run_inline`` runs rollouts in this process, required when tasks are dispatched inline."""
    runner = TaskRunner(settings, factory, run_inline)
    token = announce(settings)  # closed by default: generated on first start when none is set
    install_access_log_redaction()
    # JSONResponse named, not left as the default: replies are rendered by json.dumps, as they always were.
    app = FastAPI(title="Polar control API", version="1", lifespan=_lifespan, default_response_class=JSONResponse)
    store = Store(factory, settings.store_statement_timeout_s)
    app.state.api = ApiState(settings, store, runner, token, gateway_url, asyncio.Event())
    app.state.runner = runner
    install_error_handlers(app)
    # The token and the body's size are checked before FastAPI reads a byte of a body (polar.api.guard).
    app.add_middleware(BodyGuard, screen=api_screen(settings, token), shape=error_response)
    for router in ROUTERS:
        # Added route by route, not with include_router: FastAPI keeps an included router whole, and
        # ``app.routes`` lists the API's routes themselves (the auth tests walk them).
        app.router.routes.extend(router.routes)
    install_ui(app, settings, factory, token)  # the web UI at /ui, behind the same control token
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ApiState = app.state.api
    loop = asyncio.create_task(_background(state))
    async with metrics.loop_lag_monitor("api"):
        yield
    loop.cancel()
    with suppress(asyncio.CancelledError):
        await loop
    await state.runner.aclose()


async def _background(state: ApiState) -> None:
    """Admit and start tasks and deliver due callbacks, every ``POLAR_API_POLL_S`` or when woken."""
    while True:
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(state.wake.wait(), state.settings.api_poll_s)
        state.wake.clear()
        try:
            await state.runner.tick()
            await asyncio.to_thread(deliver_due, state.store.factory, state.settings)
        except Exception:
            log.exception("control API background pass failed")
