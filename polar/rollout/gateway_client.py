"""The pipeline's side of the gateway's session API: open a rollout's session (getting its key), close it.

Opening always asks for a new key (``replace_key``): a retried run stage cannot recover the key of an earlier
attempt (only its hash is stored), and a new key also locks out any harness still running from that attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from harness_adapters.base import SessionAccess
from polar.errors import GatewayError


class GatewayClient:
    def __init__(self, url: str, *, control_token: str = "", timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {control_token}"} if control_token else {}
        self._timeout = timeout_s

    async def _post(self, path: str, body: Mapping[str, Any] | None = None) -> httpx.Response:
        try:
            async with httpx.AsyncClient(timeout=self._timeout, headers=self._headers, trust_env=False) as client:
                return await client.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise GatewayError(f"cannot reach the gateway at {self.url}: {exc.__class__.__name__}: {exc}") from None

    async def open_session(self, rollout_id: str, *, policy: Mapping[str, Any] | None = None) -> SessionAccess:
        reply = await self._post("/v1/sessions", {"rollout_id": rollout_id, "policy": policy, "replace_key": True})
        if reply.status_code != 201:
            raise GatewayError(
                f"the gateway refused a session for rollout {rollout_id}: {reply.status_code} {reply.text[:300]}"
            )
        body = reply.json()
        window = body.get("context_length")  # an older gateway does not send it
        return SessionAccess(
            session_id=body["session_id"],
            api_key=body["api_key"],
            base_urls=body["base_urls"],
            context_length=window if isinstance(window, int) and window > 0 else None,
        )

    async def close_session(self, session_id: str) -> None:
        """Close the session (idempotent); a session that never opened is fine too."""
        reply = await self._post(f"/v1/sessions/{session_id}/close")
        if reply.status_code not in (200, 404):
            raise GatewayError(
                f"the gateway could not close session {session_id}: {reply.status_code} {reply.text[:300]}"
            )
