"""What ``polar serve`` checks before a request's body is read (``polar.httpserve.guard.BodyGuard`` applies it).

- ``/v1/...`` and ``/metrics`` need the control token as a Bearer token: without it the answer is the API's 401,
  before a byte of the body is read (FastAPI would otherwise read and parse the body first).
- ``/ui/...`` without the token in a form the UI takes (``polar.ui.auth.holds_token``) reaches the UI with an
  empty body, so its own guard answers with its 401 page; its routes take no body anyway.
- Every body is limited to ``POLAR_MAX_BODY_BYTES``, except a weights upload (``POST /v1/weights`` with
  safetensors bytes), limited to ``MAX_WEIGHT_BYTES``. ``/health``, ``/`` and the API docs stay open.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import Scope

from polar.auth import bearer_of, matches
from polar.errors import AuthenticationError
from polar.httpserve.body import MAX_WEIGHT_BYTES
from polar.httpserve.guard import Screen, header
from polar.settings import Settings
from polar.ui.auth import holds_token

CONTROL_MESSAGE = "this endpoint needs the control token as a Bearer token"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def api_screen(settings: Settings, token: str) -> Callable[[Scope], Screen]:
    """The screen of the control API enforcing ``token`` (the control token in force)."""

    def screen(scope: Scope) -> Screen:
        path = str(scope["path"])
        limit = settings.max_body_bytes
        if (
            scope["method"] == "POST"
            and path == "/v1/weights"
            and (header(scope, b"content-type") or "").startswith("application/octet-stream")
        ):
            limit = MAX_WEIGHT_BYTES
        if _under(path, "/v1") or path == "/metrics":
            if not matches(bearer_of(header(scope, b"authorization")), token):
                return Screen(limit, refusal=AuthenticationError(CONTROL_MESSAGE))
        elif _under(path, "/ui") and not holds_token(Request(scope), token):
            return Screen(limit, withhold=True)
        return Screen(limit)

    return screen
