"""Who may see the web UI: whoever holds the control token.

The token is accepted as the control API takes it (``Authorization: Bearer ...``) or once as ``?token=`` on any
``/ui`` URL: a right one answers with a redirect to the same URL without it, setting an HttpOnly cookie (path
``/ui``, SameSite Strict) so the browser's later requests, the page's own ``fetch`` calls included, carry it.
The cookie holds an HMAC of the token, not the token, so a leaked cookie opens the UI but not the ``/v1`` API.
The token is the one the control API enforces (``polar.auth.announce``: ``POLAR_CONTROL_TOKEN``, or the token
generated in ``$POLAR_HOME/control-token``), handed in once by ``install_ui``: there is no open mode.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from fastapi import Request

from polar.auth import bearer_of, matches

COOKIE = "polar_ui"


class UIRefused(Exception):
    """The request holds no valid token: answered with the UI's 401 page."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UITokenAccepted(Exception):
    """A right ``?token=``: answered with a redirect to ``location`` that sets the cookie ``value``."""

    def __init__(self, location: str, value: str):
        super().__init__(location)
        self.location = location
        self.value = value


def cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"polar-ui-session", hashlib.sha256).hexdigest()


def holds_token(request: Request, token: str) -> bool:
    """Whether ``request`` holds ``token`` in any form the UI takes (Bearer, ``?token=``, the cookie), decided from
    its headers alone: ``polar serve`` checks this before the body is read (``polar.api.guard``)."""
    if matches(bearer_of(request.headers.get("authorization")), token):
        return True
    if matches(request.query_params.get("token"), token):
        return True
    return bool(token) and matches(request.cookies.get(COOKIE), cookie_value(token))


def ui_guard(token: str) -> Callable[[Request], Awaitable[None]]:
    """The FastAPI dependency that guards every ``/ui`` route (raises ``UIRefused`` / ``UITokenAccepted``).

    ``token`` is the control token in force; an empty one refuses everything (``matches`` never accepts it)."""

    async def guard(request: Request) -> None:
        if matches(bearer_of(request.headers.get("authorization")), token):
            return
        given = request.query_params.get("token")
        if given is not None:
            if not matches(given, token):
                raise UIRefused("the token in the URL is not the control token")
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            location = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            raise UITokenAccepted(location, cookie_value(token))
        cookie = request.cookies.get(COOKIE)
        if token and matches(cookie, cookie_value(token)):
            return
        raise UIRefused("this page needs the control token: open it once as /ui?token=<the control token>")

    return guard
