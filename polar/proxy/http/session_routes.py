"""The gateway's session-control routes: create, read, close a session and list its captures.

Control routes take the control token as a Bearer token; a session key may read its own session and captures
(``authorize_control``, which the admin routes use too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from db import Capture, full_prompt_ids, session_scope
from db.request_json import full_request_json
from polar.auth import bearer_of, matches
from polar.capture_extras import CaptureOptions, check_capture
from polar.errors import AuthenticationError, PermissionDenied, PolarError, invalid_from
from polar.proxy.gateway import Gateway
from polar.proxy.http.health import finite_or_none
from polar.wire import OPENAI_CHAT, ProtocolCodec
from polar.wire.body import read_json
from polar.wire.policy import ScriptedPolicySpec


def api_key(request: Request, *, query: bool = False) -> str | None:
    """A session key: a Bearer token or the provider's own header; ``?key=`` only where ``query`` (the Gemini
    paths, where Google's clients put it; the access log redacts it)."""
    key = bearer_of(request.headers.get("authorization"))
    key = key or request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")
    if key is None and query:
        key = request.query_params.get("key")
    return key


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: dict[str, Any] | None = Field(default=None, description="e.g. a scripted policy for tests")
    models: list[str] | None = Field(default=None, description="model names to accept; default any")
    rollout_id: str | None = None
    replace_key: bool = Field(default=False, description="a new key for rollout_id's existing session")
    capture: CaptureOptions | None = Field(default=None, description="top_logprobs: k, routed_experts: true")


def add_session_routes(
    app: FastAPI,
    gw: Gateway,
    control_token: str,
    control_error: Callable[[PolarError], JSONResponse],
    internal: Callable[[ProtocolCodec, str], JSONResponse],
) -> Callable[..., Awaitable[None]]:
    """Add the routes; returns ``authorize_control(request, session_id=None)``."""
    _control_error, _internal = control_error, internal

    async def authorize_control(request: Request, session_id: str | None = None) -> None:
        """The control token (only as ``Authorization: Bearer``), or a session key reading its own session
        (``session_id``); anything else is a 401, another session's key a 403."""
        if matches(bearer_of(request.headers.get("authorization")), control_token):
            return
        key = api_key(request)
        if key:
            own = await gw.in_store(gw.sessions.session_of_key, key)
            if own is not None:
                if session_id is not None and matches(own, session_id):
                    return
                raise PermissionDenied("a session key cannot act on another session or create sessions")
        raise AuthenticationError("this endpoint needs the control token as a Bearer token")

    @app.post("/v1/sessions")
    async def create_session(request: Request) -> Response:
        try:
            await authorize_control(request)
            raw = await read_json(request, gw.settings.max_body_bytes, gw.limits)
            try:
                spec = SessionCreate.model_validate(raw if raw is not None else {})
            except ValidationError as exc:
                raise invalid_from(exc, "session request") from None
            if spec.policy is not None:
                ScriptedPolicySpec.parse(spec.policy)  # reject a bad script now, not at the first call
            info, key = await gw.in_store(
                partial(
                    gw.sessions.create,
                    policy=spec.policy,
                    models=spec.models,
                    rollout_id=spec.rollout_id,
                    replace_key=spec.replace_key,
                    capture=spec.capture.model_dump(exclude_defaults=True) if spec.capture else None,
                )
            )
            check_capture(info.capture, gw.settings.capture_extras)  # its own options or its task's
            if spec.rollout_id is None:
                gw.histories.opened(info.id)
        except PolarError as exc:
            return _control_error(exc)
        except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
            return _internal(OPENAI_CHAT, "POST /v1/sessions")
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

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        try:
            await authorize_control(request, session_id)
            info = await gw.in_store(gw.sessions.get, session_id)
        except PolarError as exc:
            return _control_error(exc)
        return JSONResponse({"session_id": info.id, "closed": info.closed, "models": list(info.models)})

    @app.api_route("/v1/sessions/{session_id}/close", methods=["POST"])
    @app.delete("/v1/sessions/{session_id}")
    async def close_session(session_id: str, request: Request) -> Response:
        try:
            await authorize_control(request)
            info = await gw.in_store(gw.sessions.close, session_id)
        except PolarError as exc:
            return _control_error(exc)
        gw.histories.forget(session_id)
        return JSONResponse({"session_id": info.id, "closed": True})

    @app.get("/v1/sessions/{session_id}/captures")
    async def list_captures(
        session_id: str, request: Request, full_prompt: bool = False, requests: bool = False
    ) -> Response:
        try:
            await authorize_control(request, session_id)
            await gw.in_store(gw.sessions.get, session_id)
            rows = await gw.in_store(_captures, gw, session_id, full_prompt, requests)
        except PolarError as exc:
            return _control_error(exc)
        except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
            return _internal(OPENAI_CHAT, "GET captures")
        return JSONResponse({"session_id": session_id, "captures": rows})

    return authorize_control


CAPTURE_FIELDS = (
    "id",
    "seq",
    "protocol",
    "model",
    "status",
    "error",
    "parent_id",
    "prefix_len",
    "n_prompt",
    "n_prompt_delta",
    "n_output",
    "prompt_delta_ids",
    "output_ids",
    "output_logprobs",
    "finish_reason",
    "matched_stop",
    "weight_version",
    "version_spans",
    "sampling_params",
    "render_mode",
    "backend",
    "logprob_semantics",
    "latency_s",
    "ttft_s",
    "admission",
    "admission_cause",
)


def _captures(gw: Gateway, session_id: str, full_prompt: bool, requests: bool) -> list[dict[str, Any]]:
    with session_scope(gw.factory) as db:
        rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)).all()
        out = []
        for row in rows:
            item = {name: getattr(row, name) for name in CAPTURE_FIELDS}
            # A non-finite logprob stored before output checks existed must not make this listing fail.
            item["output_logprobs"] = finite_or_none(row.output_logprobs)
            item["status"] = row.status.value
            item["created_at"] = row.created_at.isoformat()
            if full_prompt:
                item["prompt_ids"] = full_prompt_ids(db, row)
            if requests:
                item["request"] = full_request_json(db, row)  # as the harness sent it
            out.append(item)
        return out
