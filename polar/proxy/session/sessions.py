"""Gateway sessions: one per rollout, reached with a secret key that the harness uses as its API key.

Only a hash of the key is stored. Unknown keys are rejected (401) and closed sessions refused (403);
nothing is ever auto-created.

The gateway's hot path asks ``cached`` first: a key this process has checked against the store is trusted
without a read. An entry older than ``ttl_s`` is still trusted, and queued for ``recheck``, which reads the
queued keys' sessions in one query per batch, off the hot path (stale while revalidating: a harness whose tool
runs outlast the TTL would otherwise make every call wait on the store). Closing or re-keying a session in this
process drops its entries at once; done elsewhere (another replica, the control API, a flow's takeover) it is
seen here at the first recheck after ``ttl_s``, and before that by the capture writer, which commits a capture
only while its session is open under the key it was authenticated with (``CaptureWriter``), so no reply is ever
acknowledged on a revoked key. A key opened here is in that cache from the start; elsewhere the first call with
it reads the store, and ``on_key`` tells the history cache (a relaunched harness's calls start a history of
their own on every replica).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db import Rollout, session_scope
from db.enums import RolloutStatus
from polar.capture_extras import CaptureOptions, options_of
from polar.errors import AuthenticationError, NotFound, PermissionDenied


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class SessionInfo:
    id: str  # the rollout id
    policy: dict[str, Any] | None
    models: tuple[str, ...]  # model names this session accepts; empty accepts any
    closed: bool
    key_hash: str | None = None  # the hash of the key it was opened with (the writer checks it at commit)
    capture: CaptureOptions | None = None  # top-k logprobs / routed experts its calls capture (polar.capture_extras)


def _info(row: Rollout) -> SessionInfo:
    policy = row.policy or {}
    return SessionInfo(
        id=row.id,
        policy=policy.get("policy"),
        models=tuple(policy.get("models") or ()),
        closed=row.closed_at is not None,
        key_hash=row.session_token_hash,
        capture=options_of(policy.get("capture")),
    )


class SessionStore:
    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        ttl_s: float = 0.0,
        max_keys: int = 100_000,
        on_key: Callable[[str, str | None], None] | None = None,
        on_stale: Callable[[], None] | None = None,
    ):
        """``ttl_s``: how long ``cached`` trusts a key checked against the store before queueing it for a recheck
        (0: no cache). ``on_key(session id, key hash)`` is told the key of every session read from the store or
        opened here (the history cache drops a session's calls when its key changed: a harness launched again
        starts a new history). ``on_stale()`` is called when ``cached`` queues a key: run ``recheck`` soon."""
        self._factory = factory
        self._on_key = on_key
        self._on_stale = on_stale
        self._ttl_s = ttl_s
        self._max_keys = max_keys
        self._cache: dict[str, tuple[SessionInfo, float]] = {}  # key hash -> (open session, checked at)
        self._stale: set[str] = set()  # key hashes waiting for ``recheck``
        self._lock = threading.Lock()  # held for dict updates only, never across I/O

    def cached(self, key: str | None) -> SessionInfo | None:
        """The open session of ``key`` as this process last checked it; None means: ask ``authenticate``. Never
        blocks (no I/O). An entry checked more than ``ttl_s`` ago is returned too, and its key queued for
        ``recheck``."""
        if not key or self._ttl_s <= 0:
            return None
        key_hash = hash_key(key)
        entry = self._cache.get(key_hash)
        if entry is None:
            return None
        if time.monotonic() - entry[1] > self._ttl_s and key_hash not in self._stale:
            with self._lock:
                self._stale.add(key_hash)
            if self._on_stale is not None:
                self._on_stale()
        return entry[0]

    def recheck(self, batch: int = 500) -> int:
        """Read the sessions of up to ``batch`` queued keys again, in one query (blocking: call from a worker
        thread): an open session's entry is renewed, a closed or re-keyed one's dropped (its next call
        authenticates against the store and is refused). Returns how many keys it read; on a store error they
        stay queued."""
        with self._lock:
            hashes = [self._stale.pop() for _ in range(min(batch, len(self._stale)))]
        if not hashes:
            return 0
        try:
            with session_scope(self._factory) as db:
                rows = db.scalars(sa.select(Rollout).where(Rollout.session_token_hash.in_(hashes)))
                found = {info.key_hash: info for info in map(_info, rows)}
        except BaseException:
            with self._lock:
                self._stale.update(hashes)
            raise
        now = time.monotonic()
        with self._lock:
            for key_hash in hashes:
                info = found.get(key_hash)
                if info is None or info.closed:
                    self._cache.pop(key_hash, None)
                elif key_hash in self._cache:  # not forgotten here meanwhile
                    self._cache[key_hash] = (info, now)
        return len(hashes)

    def _remember(self, info: SessionInfo) -> None:
        if self._ttl_s <= 0 or info.key_hash is None or info.closed:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._cache) >= self._max_keys:
                stale = [h for h, (_, at) in self._cache.items() if now - at > self._ttl_s]
                for h in stale or list(self._cache)[: self._max_keys // 2]:
                    del self._cache[h]
            self._cache[info.key_hash] = (info, now)

    def forget(self, session_id: str) -> None:
        """Drop every cached key of ``session_id`` (closed or re-keyed here)."""
        with self._lock:
            for h in [h for h, (info, _) in self._cache.items() if info.id == session_id]:
                del self._cache[h]

    def create(
        self,
        *,
        policy: dict[str, Any] | None = None,
        models: list[str] | None = None,
        rollout_id: str | None = None,
        replace_key: bool = False,
        capture: dict[str, Any] | None = None,
    ) -> tuple[SessionInfo, str]:
        """A new session (or a key for an existing rollout that has none yet); returns it and its key.

        ``replace_key`` gives an existing rollout's session a new key (a retried run stage: the old key, held by
        a harness of the failed attempt, stops working at once) and reopens it if it was closed.
        """
        key = "sk-polar-" + secrets.token_urlsafe(32)
        with session_scope(self._factory) as db:
            row = db.get(Rollout, rollout_id) if rollout_id else None
            if rollout_id and row is None:
                raise NotFound(f"rollout {rollout_id!r} does not exist", field="rollout_id")
            if row is None:
                row = Rollout(status=RolloutStatus.RUNNING, started_at=datetime.now(UTC))
                db.add(row)
            elif row.session_token_hash is not None and not replace_key:
                raise PermissionDenied(f"rollout {rollout_id!r} already has a session", field="rollout_id")
            else:
                row.closed_at = None
            row.session_token_hash = hash_key(key)
            # A task's capture options (set at submission) stay unless the session asks its own.
            kept = capture if capture is not None else (row.policy or {}).get("capture")
            row.policy = {"policy": policy, "models": models or []} | ({"capture": kept} if kept else {})
            db.flush()
            info = _info(row)
        self.forget(info.id)  # a replaced key stops working here at once
        if self._on_key is not None:
            self._on_key(info.id, info.key_hash)
        self._remember(info)  # its first call reads nothing
        return info, key

    def authenticate(self, key: str | None) -> SessionInfo:
        if not key:
            raise AuthenticationError(
                "missing API key: send the session key as a Bearer token, x-api-key or x-goog-api-key"
            )
        with session_scope(self._factory) as db:
            row = db.scalar(sa.select(Rollout).where(Rollout.session_token_hash == hash_key(key)))
            if row is None:
                raise AuthenticationError("invalid API key: no session has this key")
            info = _info(row)
        if info.closed:
            self.forget(info.id)
            raise PermissionDenied(f"session {info.id} is closed")
        if self._on_key is not None:
            self._on_key(info.id, info.key_hash)
        self._remember(info)
        return info

    def session_of_key(self, key: str) -> str | None:
        """The id of the session this key opens, if any (closed sessions included)."""
        with session_scope(self._factory) as db:
            return db.scalar(sa.select(Rollout.id).where(Rollout.session_token_hash == hash_key(key)))

    def get(self, session_id: str) -> SessionInfo:
        with session_scope(self._factory) as db:
            row = db.get(Rollout, session_id)
            if row is None or row.session_token_hash is None:
                raise NotFound(f"session {session_id!r} does not exist", field="session_id")
            return _info(row)

    def close(self, session_id: str) -> SessionInfo:
        with session_scope(self._factory) as db:
            row = db.get(Rollout, session_id)
            if row is None or row.session_token_hash is None:
                raise NotFound(f"session {session_id!r} does not exist", field="session_id")
            row.closed_at = row.closed_at or datetime.now(UTC)
            if row.task_id is None and not RolloutStatus(row.status).is_terminal:
                # A gateway-only session (the caller's own orchestrator): closing it is its end, so its
                # trajectories can be built. A pipeline rollout's status stays the pipeline's to set.
                row.status = RolloutStatus.COMPLETED
                row.finished_at = row.finished_at or row.closed_at
            info = _info(row)
        self.forget(session_id)
        return info
