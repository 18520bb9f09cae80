"""What a route of the gateway is (``Route``), and what the table of them answers: the route a request is for,
the error shape of any path, the access log's name for a request.

The table itself is ``polar.proxy.http.routes.ROUTES``; this module holds no handler, so the access log
(``polar.proxy.access_log``), which the call pipeline imports, can read the table without importing the routes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.routing import compile_path

from polar.wire import OPENAI_CHAT, ProtocolCodec

# The error shape of a path that no route serves and that shares no more of its leading segments with one
# protocol's routes than with another's.
DEFAULT_SHAPE: ProtocolCodec = OPENAI_CHAT


@dataclass(frozen=True)
class Route:
    """One route: ``handler(request, route)`` serves ``methods`` on ``path`` (Starlette's path syntax; path
    parameters in ``request.path_params``). ``protocol``: the protocol its errors are shaped in (and, on a model
    route, the one it speaks). ``log_as``: the access log's route name for its requests, formatted with the path's
    parameters (None: not logged). ``in_schema``: listed in the OpenAPI schema. ``direct``: served straight from
    this table (``polar.proxy.http.direct``), not through FastAPI's routing: a handler that shapes every error
    itself and takes nothing from FastAPI (the model calls, the hot path)."""

    methods: tuple[str, ...]
    path: str
    handler: Callable[[Request, Route], Awaitable[Response]]
    protocol: ProtocolCodec = OPENAI_CHAT
    log_as: str | None = None
    in_schema: bool = True
    direct: bool = False
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", compile_path(self.path)[0])

    def params(self, path: str) -> dict[str, Any] | None:
        """The path's parameters when ``path`` is this route's (any method), else None."""
        match = self._regex.match(path)
        return match.groupdict() if match else None

    @property
    def segments(self) -> tuple[str, ...]:
        return _segments(self.path)


def _segments(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def _shared(route: Route, parts: tuple[str, ...]) -> int:
    """How many leading segments ``parts`` shares with the route's path (a parameter matches any segment)."""
    n = 0
    for own, part in zip(route.segments, parts, strict=False):
        if own != part and not own.startswith("{"):
            break
        n += 1
    return n


def error_shape(routes: Sequence[Route], path: str) -> ProtocolCodec:
    """The protocol ``path``'s errors take: its route's; for a path no route serves, that of the routes it shares
    the most leading segments with (Google's under ``/v1beta``, Anthropic's under ``/v1/messages``), the default
    (OpenAI's) when those disagree."""
    for route in routes:
        if route.params(path) is not None:
            return route.protocol
    parts = _segments(path)
    best = max((_shared(route, parts) for route in routes), default=0)
    shapes = {route.protocol.name: route.protocol for route in routes if _shared(route, parts) == best}
    return next(iter(shapes.values())) if best > 0 and len(shapes) == 1 else DEFAULT_SHAPE


class RouteLookup:
    """The route serving ``method path`` among ``routes`` (``find``): the fixed paths one dict lookup, the few
    with parameters matched in turn."""

    def __init__(self, routes: Sequence[Route]):
        self._fixed = {
            (method, route.path): route for route in routes if "{" not in route.path for method in route.methods
        }
        self._templated = [route for route in routes if "{" in route.path]

    def find(self, method: str, path: str) -> tuple[Route, dict[str, Any]] | None:
        """The route and the path's parameters, or None when none of ``routes`` serves it."""
        fixed = self._fixed.get((method, path))
        if fixed is not None:
            return fixed, {}
        for route in self._templated:
            if method in route.methods and (params := route.params(path)) is not None:
                return route, params
        return None


class AccessNames:
    """The access log's route name for a request (``name``), read from the routes with ``log_as``: looked up per
    request before routing, so the fixed paths are one dict lookup."""

    def __init__(self, routes: Sequence[Route]):
        self._lookup = RouteLookup([route for route in routes if route.log_as is not None])

    def name(self, method: str, path: str) -> str | None:
        """The route name ``method path`` is logged under, or None when its requests are not logged."""
        found = self._lookup.find(method, path)
        if found is None:
            return None
        route, params = found
        return str(route.log_as).format(**params) if params else str(route.log_as)
