"""What every route of the gateway's app reads from it (``served(request)``): the gateway and its session service
(which holds the control token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from fastapi import Request

from polar.auth import bearer_of

if TYPE_CHECKING:
    from polar.proxy.gateway import Gateway
    from polar.proxy.session.service import SessionService


@dataclass(frozen=True)
class Served:
    gateway: Gateway
    sessions: SessionService


def served(request: Request) -> Served:
    """The app's ``Served`` (``create_app`` puts it on ``app.state.served``)."""
    return cast(Served, request.app.state.served)


def api_key(request: Request, *, query: bool = False) -> str | None:
    """A session key: a Bearer token or the provider's own header; ``?key=`` only where ``query`` (the Gemini
    paths, where Google's clients put it; the access log redacts it)."""
    key = bearer_of(request.headers.get("authorization"))
    key = key or request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")
    if key is None and query:
        key = request.query_params.get("key")
    return key


async def authorize_control(request: Request, session_id: str | None = None) -> None:
    """The control token (only as ``Authorization: Bearer``), or a session key reading its own session
    (``session_id``); anything else is a 401, another session's key a 403 (``SessionService.authorize``)."""
    await served(request).sessions.authorize(
        bearer_of(request.headers.get("authorization")), api_key(request), session_id
    )


def require_control(request: Request) -> None:
    """The control token as ``Authorization: Bearer``, and nothing else (a 401)."""
    served(request).sessions.require_control(bearer_of(request.headers.get("authorization")))
