"""The model calls served straight from the route table, before FastAPI.

A model call is the gateway's hot path, and its handler (``polar.proxy.http.model_routes``) takes nothing from
FastAPI: it reads its key and body from the request, shapes every error in its protocol itself, and returns a
response. FastAPI's routing (a regex per route until one matches), its exception and exit-stack middleware and its
dependency solving were per-call work the call did not need. ``DirectRoutes`` sits inside the app's own
middleware (the access log, the request slices), so a call still passes those; any request for another route, or
another method, goes on to FastAPI as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request

from polar.proxy.http.route_table import Route, RouteLookup


class DirectRoutes:
    """ASGI middleware: the ``direct`` routes among ``routes`` answered by their handlers, the rest passed on."""

    def __init__(self, app: Any, routes: Sequence[Route]):
        self.app = app
        self._lookup = RouteLookup([route for route in routes if route.direct])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = self._lookup.find(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, scope["path_params"] = found
        response = await route.handler(Request(scope, receive), route)
        await response(scope, receive, send)
