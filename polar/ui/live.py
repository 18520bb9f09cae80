"""``/ui/live``: the live view of the fleet (``polar.live``) as a page whose parts refresh in place.

The page is server-rendered; its script fetches ``?fragment=fleet`` (gateways, stages, throughput, weights,
alarms) every ``REFRESH_MS`` and ``?fragment=curves`` (the learning curves, a heavier query) every
``CURVES_MS``, replacing each part's HTML. Routes are added to the UI's router, so the UI's guard covers them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from polar.live import LiveView, curve_charts

REFRESH_MS = 2000
CURVES_MS = 15000


def add_live_routes(router: APIRouter, view: LiveView, page: Callable[..., HTMLResponse]) -> None:
    @router.get("/live")
    async def live(request: Request) -> Response:
        fragment = request.query_params.get("fragment")
        if fragment == "fleet":
            return page("_live.html", s=await view.snapshot())
        snap = await view.snapshot(curves=True)
        charts: dict[str, Any] = curve_charts(snap.curves) if snap.curves is not None else {}
        if fragment == "curves":
            return page("_curves.html", charts=charts, curves=snap.curves)
        return page("live.html", s=snap, charts=charts, curves=snap.curves, refresh_ms=REFRESH_MS, curves_ms=CURVES_MS)
