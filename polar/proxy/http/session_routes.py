"""The gateway's session-control routes: create, read, close a session and list its captures.

Each parses the request, calls the session service (``polar.proxy.session.service``) and shapes the reply; errors
leave through ``polar.proxy.http.errors`` in the route's protocol (``polar.proxy.http.routes``). Control routes
take the control token as a Bearer token; a session key may read its own session and captures.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import TypeAdapter, ValidationError

from polar.errors import InvalidRequest, PolarError, invalid_from
from polar.httpserve.body import read_json
from polar.proxy.http.errors import error_response, internal_error
from polar.proxy.http.route_table import Route
from polar.proxy.http.served import authorize_control, served
from polar.proxy.session.service import SessionCreate

_FLAG = TypeAdapter(bool)


async def create_session(request: Request, route: Route) -> Response:
    gw, sessions = served(request).gateway, served(request).sessions
    try:
        await authorize_control(request)
        raw = await read_json(request, gw.settings.max_body_bytes, gw.limits)
        try:
            spec = SessionCreate.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            raise invalid_from(exc, "session request") from None
        info, key = await sessions.open(spec)
    except PolarError as exc:
        return error_response(route.protocol, exc)
    except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
        return internal_error(route.protocol, "POST /v1/sessions")
    base = str(request.base_url).rstrip("/")
    return JSONResponse(
        {
            "session_id": info.id,
            "api_key": key,
            "base_urls": {"openai": f"{base}/v1", "anthropic": base, "gemini": base},
            "context_length": gw.calls.context_length,
        },
        status_code=201,
    )


async def get_session(request: Request, route: Route) -> Response:
    session_id = request.path_params["session_id"]
    try:
        await authorize_control(request, session_id)
        info = await served(request).sessions.get(session_id)
    except PolarError as exc:
        return error_response(route.protocol, exc)
    return JSONResponse({"session_id": info.id, "closed": info.closed, "models": list(info.models)})


async def close_session(request: Request, route: Route) -> Response:
    session_id = request.path_params["session_id"]
    try:
        await authorize_control(request)
        info = await served(request).sessions.close(session_id)
    except PolarError as exc:
        return error_response(route.protocol, exc)
    return JSONResponse({"session_id": info.id, "closed": True})


async def list_captures(request: Request, route: Route) -> Response:
    session_id = request.path_params["session_id"]
    try:
        full_prompt, requests = _flag(request, "full_prompt"), _flag(request, "requests")
        await authorize_control(request, session_id)
        rows = await served(request).sessions.captures(session_id, full_prompt=full_prompt, requests=requests)
    except PolarError as exc:
        return error_response(route.protocol, exc)
    except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
        return internal_error(route.protocol, "GET captures")
    return JSONResponse({"session_id": session_id, "captures": rows})


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter (absent: False), read as FastAPI reads one; a bad value is a 400 naming it."""
    value = request.query_params.get(name)
    if value is None:
        return False
    try:
        return _FLAG.validate_python(value)
    except ValidationError as exc:
        field = f"query.{name}"
        raise InvalidRequest(f"invalid {field}: {exc.errors()[0]['msg']}", field=field) from None
