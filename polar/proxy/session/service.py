"""Session bookkeeping behind the gateway's control routes: who may act on a session, and opening, reading and
closing sessions and listing their captures. The routes (``polar.proxy.http.session_routes``) only parse the
request, call this, and shape the reply.

Control takes the control token; a session key may read its own session and captures, nothing else (another
session's: 403; creating or closing sessions, pushing weights: 403). Every store wait is bounded
(``store_timeout_s``: a ``StoreError``, a 503).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, full_prompt_ids, session_scope
from db.request_json import full_request_json
from polar.auth import matches
from polar.capture_extras import CaptureOptions, check_capture
from polar.errors import AuthenticationError, PermissionDenied
from polar.proxy.session.history import HistoryCache
from polar.proxy.session.sessions import SessionInfo, SessionStore
from polar.store_bound import in_store
from polar.wire.policy import ScriptedPolicySpec

T = TypeVar("T")
CONTROL_ONLY = "this endpoint needs the control token as a Bearer token"


class SessionCreate(BaseModel):
    """What opening a session asks for (the body of ``POST /v1/sessions``)."""

    model_config = ConfigDict(extra="forbid")
    policy: dict[str, Any] | None = Field(default=None, description="e.g. a scripted policy for tests")
    models: list[str] | None = Field(default=None, description="model names to accept; default any")
    rollout_id: str | None = None
    replace_key: bool = Field(default=False, description="a new key for rollout_id's existing session")
    capture: CaptureOptions | None = Field(default=None, description="top_logprobs: k, routed_experts: true")


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
    "fallback_reason",
    "backend",
    "logprob_semantics",
    "latency_s",
    "ttft_s",
    "admission",
    "admission_cause",
)


def finite_or_none(values: Sequence[float] | None) -> list[float | None] | None:
    """``values`` with NaN and infinities as None (JSON has no such numbers)."""
    if values is None:
        return None
    return [value if math.isfinite(value) else None for value in values]


class SessionService:
    def __init__(
        self,
        sessions: SessionStore,
        histories: HistoryCache,
        factory: sessionmaker[Session],
        *,
        control_token: str,
        capture_extras: str,
        store_timeout_s: float,
    ):
        """``capture_extras``: the extras this gateway verified its backend returns (``POLAR_CAPTURE_EXTRAS``)."""
        self.sessions = sessions
        self.histories = histories
        self.factory = factory
        self.control_token = control_token
        self.capture_extras = capture_extras
        self.store_timeout_s = store_timeout_s

    def is_control(self, bearer: str | None) -> bool:
        return matches(bearer, self.control_token)

    def require_control(self, bearer: str | None) -> None:
        """The control token, and nothing else (a 401)."""
        if not self.is_control(bearer):
            raise AuthenticationError(CONTROL_ONLY)

    async def authorize(self, bearer: str | None, key: str | None, session_id: str | None = None) -> None:
        """The control token (``bearer``), or a session key (``key``) acting on its own session (``session_id``);
        anything else is a 401, another session's key a 403."""
        if self.is_control(bearer):
            return
        if key:
            own = await self._in_store(self.sessions.session_of_key, key)
            if own is not None:
                if session_id is not None and matches(own, session_id):
                    return
                raise PermissionDenied("a session key cannot act on another session or create sessions")
        raise AuthenticationError(CONTROL_ONLY)

    async def open(self, spec: SessionCreate) -> tuple[SessionInfo, str]:
        """A new session (or a new key for ``spec.rollout_id``'s), with its key. A bad script or capture option
        is refused now, not at the first call."""
        if spec.policy is not None:
            ScriptedPolicySpec.parse(spec.policy)
        capture = spec.capture.model_dump(exclude_defaults=True) if spec.capture else None
        info, key = await self._in_store(
            self.sessions.create,
            policy=spec.policy,
            models=spec.models,
            rollout_id=spec.rollout_id,
            replace_key=spec.replace_key,
            capture=capture,
        )
        check_capture(info.capture, self.capture_extras)  # its own options or its task's
        if spec.rollout_id is None:
            self.histories.opened(info.id)
        return info, key

    async def get(self, session_id: str) -> SessionInfo:
        return await self._in_store(self.sessions.get, session_id)

    async def close(self, session_id: str) -> SessionInfo:
        """Close the session; its history leaves this process's memory."""
        info = await self._in_store(self.sessions.close, session_id)
        self.histories.forget(session_id)
        return info

    async def captures(self, session_id: str, *, full_prompt: bool, requests: bool) -> list[dict[str, Any]]:
        """The session's captures in ``seq`` order (``CAPTURE_FIELDS``; with ``full_prompt`` each one's whole prompt
        ids, with ``requests`` the request as the harness sent it); a session that does not exist is a 404."""
        await self.get(session_id)
        return await self._in_store(self._captures, session_id, full_prompt, requests)

    def _captures(self, session_id: str, full_prompt: bool, requests: bool) -> list[dict[str, Any]]:
        with session_scope(self.factory) as db:
            query = sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)
            out = []
            for row in db.scalars(query).all():
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

    async def _in_store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await in_store(fn, *args, timeout_s=self.store_timeout_s, **kwargs)
