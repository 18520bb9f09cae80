"""Refusing a WebSocket upgrade without an ERROR in the log.

uvicorn 0.54's WebSocket protocol logs "ASGI callable returned without completing handshake." at ERROR after an
app answers an upgrade with a denial response (``websocket.http.response.*``), although that is a complete,
valid answer (the 426 reaches the client). Codex tries the upgrade on every start, so each run logged an ERROR.
``deny`` marks the current task's context before sending the denial; the filter drops exactly that record in
that context (uvicorn logs it in the task that awaited the app), and nothing else.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from fastapi import WebSocket
from fastapi.responses import JSONResponse

_DENIED: ContextVar[bool] = ContextVar("polar_ws_denied", default=False)
_MESSAGE = "ASGI callable returned without completing handshake."


class _DeniedHandshakeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (_DENIED.get() and record.getMessage() == _MESSAGE)


_FILTER = _DeniedHandshakeFilter()


def install() -> None:
    """Add the filter to uvicorn's error logger (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


async def deny(websocket: WebSocket, response: JSONResponse) -> None:
    """Answer the upgrade with ``response`` (e.g. 426); a server without the denial extension gets a close."""
    _DENIED.set(True)
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:  # a server without the WebSocket denial-response extension
        await websocket.close(code=1008)
