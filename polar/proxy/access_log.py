"""The gateway's access log: one structured line per model call (``POLAR_GATEWAY_ACCESS_LOG``: ``off``, ``text``
or ``json``), on the ``polar.access`` logger (stderr unless it has handlers of its own).

A line has the session (rollout id), protocol, route, HTTP status, outcome (``ok``, the error type of a call that
failed in generation, or ``http_<status>`` for one refused before it reached the model), prompt and output
tokens, latency (request to the end of the response body, a stream's last byte included) and commit wait (the
capture's wait for its group commit). The route is the name the route table gives the request
(``polar.proxy.http.routes``: ``log_as``; requests without one are not logged). ``install`` wraps the app in an
ASGI middleware that opens a record per model-call request in a context variable; ``noted`` (called by the call
recorder as a call's capture commits) fills it in from the capture row, so a call's numbers are the ones the store
holds.

Text: ``session=... protocol=openai_chat route=/v1/chat/completions status=200 outcome=ok prompt_tokens=41
output_tokens=7 latency_ms=35.2 commit_wait_ms=1.9``; JSON: the same keys as one object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from polar.settings import AccessLog, Settings

log = logging.getLogger("polar.access")
_current: ContextVar[_Record | None] = ContextVar("polar_access_record", default=None)


class RouteNames(Protocol):
    """The route table's access-log names (``polar.proxy.http.route_table.AccessNames``)."""

    def name(self, method: str, path: str) -> str | None:
        """The route name ``method path`` is logged under, or None when its requests are not logged."""
        ...


@dataclass
class _Record:
    route: str
    session: str | None = None
    protocol: str | None = None
    status: int | None = None
    outcome: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float | None = None
    commit_wait_ms: float | None = None


def noted(row: Any, commit_wait_s: float) -> None:
    """A capture of the current call committed (``row``: its ``Capture``); no-op outside a logged call."""
    record = _current.get()
    if record is None:
        return
    record.session, record.protocol = row.rollout_id, row.protocol
    record.prompt_tokens, record.output_tokens = int(row.n_prompt or 0), int(row.n_output or 0)
    record.outcome = "ok" if not row.error else str(row.error).split(":", 1)[0]
    record.commit_wait_ms = round(commit_wait_s * 1e3, 3)


def format_line(record: _Record, mode: AccessLog) -> str:
    fields = asdict(record)
    if mode is AccessLog.JSON:
        return json.dumps(fields, separators=(",", ":"))
    order = ("session", "protocol", "route", "status", "outcome", "prompt_tokens", "output_tokens", "latency_ms")
    return " ".join(f"{k}={'-' if fields[k] is None else fields[k]}" for k in (*order, "commit_wait_ms"))


class AccessLogMiddleware:
    """Pure ASGI (no extra task per request): the record lives in the request's own context. ``names``: the
    route table's access-log names (a request without one is not logged)."""

    def __init__(self, app: Any, mode: AccessLog, names: RouteNames):
        self.app = app
        self.mode = mode
        self.names = names

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.names.name(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        record = _Record(route=route)
        token = _current.set(record)
        started = time.perf_counter()

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _current.reset(token)
            record.latency_ms = round((time.perf_counter() - started) * 1e3, 3)
            if record.outcome is None:
                record.outcome = "ok" if record.status == 200 else f"http_{record.status}"
            log.info(format_line(record, self.mode))


def install(app: Any, settings: Settings, names: RouteNames) -> None:
    """Log the app's model calls (the routes ``names`` names: ``log_as`` in the route table) as
    ``settings.gateway_access_log`` says (nothing when ``off``)."""
    mode = settings.gateway_access_log
    if mode is AccessLog.OFF:
        return
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO)
    app.add_middleware(AccessLogMiddleware, mode=mode, names=names)
