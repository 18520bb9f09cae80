"""The gateway's health routes: liveness, readiness (store and backend, each bounded), ``/health``, and ``/``.

- ``GET /health/live``: 200 ``{"status": "live"}`` while the process serves HTTP; it checks nothing else, so a
  frozen store or a dead backend never makes an orchestrator restart a healthy gateway.
- ``GET /health/ready``: 200 ``{"status": "ready", "checks": {...}}`` when the store answers ``SELECT 1`` and the
  backend reports its weight version, each within ``health_timeout_s``; otherwise 503 with
  ``"status": "not_ready"``, the failing check's ``error`` and an OpenAI-shaped ``error`` object.
- ``GET /health``: the same checks, plus the backend's name and weight version at the top level (``"ok"`` or a 503
  ``"degraded"``), for the tools and tests that already poll it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from db import session_scope
from polar.errors import RETRY_AFTER_S
from polar.proxy.http.route_table import Route
from polar.proxy.http.served import served

if TYPE_CHECKING:
    from polar.proxy.gateway import Gateway


async def _timed(check: Callable[[], Awaitable[Any]], timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        value = await asyncio.wait_for(check(), timeout_s)
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {timeout_s:g} s"}
    except Exception as exc:  # noqa: BLE001 -- any failure of the dependency is "not ready", never a 500 of this route
        detail = str(exc).strip().splitlines()
        return {"ok": False, "error": f"{type(exc).__name__}: {detail[0] if detail else ''}"[:500]}
    out: dict[str, Any] = {"ok": True, "latency_s": round(time.perf_counter() - started, 4)}
    if value is not None:
        out["value"] = value
    return out


async def readiness(gw: Gateway) -> dict[str, dict[str, Any]]:
    """Each dependency's check: ``{"store": {"ok": ...}, "backend": {"ok": ..., "weight_version": ...}}``."""
    timeout = gw.settings.health_timeout_s

    def select_one() -> None:
        with session_scope(gw.factory) as db:
            db.execute(sa.text("SELECT 1"))

    async def store() -> None:
        await asyncio.to_thread(select_one)

    store_check, backend_check = await asyncio.gather(
        _timed(store, timeout), _timed(gw.backend.weight_version, timeout)
    )
    if "value" in backend_check:
        backend_check["weight_version"] = backend_check.pop("value")
    return {"store": store_check, "backend": {"name": gw.backend.name, **backend_check}}


def _not_ready(checks: dict[str, dict[str, Any]], status: str, **extra: Any) -> JSONResponse:
    failed = [name for name, check in checks.items() if not check["ok"]]
    message = "; ".join(f"{name}: {checks[name]['error']}" for name in failed)
    error = {"message": f"not ready: {message}", "type": "service_unavailable", "param": None, "code": None}
    body = {"status": status, **extra, "checks": checks, "error": error}
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})  # retryable, as every 503


async def root(request: Request, route: Route) -> Response:
    """``/``: a probe."""
    return JSONResponse({"service": "polar-gateway", "status": "ok"})


async def live(request: Request, route: Route) -> Response:
    return JSONResponse({"status": "live"})


async def ready(request: Request, route: Route) -> Response:
    checks = await readiness(served(request).gateway)
    if all(check["ok"] for check in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    return _not_ready(checks, "not_ready")


async def health(request: Request, route: Route) -> Response:
    gw = served(request).gateway
    checks = await readiness(gw)
    extra = {"backend": gw.backend.name, "weight_version": checks["backend"].get("weight_version")}
    if all(check["ok"] for check in checks.values()):
        return JSONResponse({"status": "ok", **extra, "checks": checks})
    return _not_ready(checks, "degraded", **extra)
