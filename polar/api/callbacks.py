"""Task-completion webhooks: POST a task's result to its ``callback_url`` once all its samples have finished.

Delivery is at least once with an idempotency key: every attempt for a task carries the same
``Idempotency-Key: polar-task-<task id>`` header (and ``idempotency_key`` in the body), so a receiver that saw
an attempt whose answer got lost can drop the repeat. A non-2xx answer or a transport error is retried with
exponential backoff (``POLAR_CALLBACK_BACKOFF_S``, doubling) up to ``POLAR_CALLBACK_ATTEMPTS``; the state of
delivery is in ``tasks.callback_state`` (``attempts``, ``delivered_at``, ``next_at``, ``last_error``,
``gave_up``). On Postgres a task being delivered is row-locked (SKIP LOCKED), so API replicas never send the
same attempt twice.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import TaskStatus
from db.models import Rollout, Task
from polar.clock import now
from polar.settings import Settings

FINISHED = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)
TIMEOUT_S = 10.0


def idempotency_key(task_id: str) -> str:
    return f"polar-task-{task_id}"


def payload(db: Session, task: Task) -> dict[str, Any]:
    rollouts = db.scalars(sa.select(Rollout).where(Rollout.task_id == task.id).order_by(Rollout.sample_index)).all()
    return {
        "event": "task.finished",
        "idempotency_key": idempotency_key(task.id),
        "task_id": task.id,
        "name": task.name,
        "status": task.status.value,
        "metadata": task.meta or {},
        "finished_at": task.finished_at.isoformat() if task.finished_at else None,
        "rollouts": [
            {
                "rollout_id": r.id,
                "sample_index": r.sample_index,
                "status": r.status.value,
                "reward": r.reward,
                "error": r.error,
            }
            for r in rollouts
        ],
    }


def _due(state: dict[str, Any] | None, at: datetime) -> bool:
    if not state:
        return True
    if state.get("delivered_at") or state.get("gave_up"):
        return False
    next_at = state.get("next_at")
    return next_at is None or datetime.fromisoformat(next_at) <= at


def deliver_due(factory: sessionmaker[Session], settings: Settings) -> int:
    """Try every due callback once (blocking; the API calls it in a worker thread); returns how many arrived."""
    at = now()
    with factory() as db:
        candidates = db.execute(
            sa.select(Task.id, Task.callback_state).where(Task.callback_url.is_not(None), Task.status.in_(FINISHED))
        ).all()
    due = [task_id for task_id, state in candidates if _due(state, at)]
    if not due:
        return 0
    with httpx.Client(timeout=TIMEOUT_S) as client:
        return sum(_deliver_one(factory, settings, client, task_id) for task_id in due)


def _deliver_one(factory: sessionmaker[Session], settings: Settings, client: httpx.Client, task_id: str) -> int:
    with session_scope(factory) as db:
        task = db.scalars(sa.select(Task).where(Task.id == task_id).with_for_update(skip_locked=True)).first()
        if task is None or not _due(task.callback_state, now()):
            return 0
        state = dict(task.callback_state or {})
        attempt = int(state.get("attempts", 0)) + 1
        body = payload(db, task)
        headers = {
            "Idempotency-Key": body["idempotency_key"],
            "X-Polar-Event": body["event"],
            "X-Polar-Attempt": str(attempt),
        }
        error = None
        try:
            reply = client.post(task.callback_url or "", json=body, headers=headers)
            if not 200 <= reply.status_code < 300:
                error = f"HTTP {reply.status_code}: {reply.text[:200]}"
        except httpx.HTTPError as exc:
            error = f"{exc.__class__.__name__}: {exc}"
        state["attempts"] = attempt
        if error is None:
            state |= {"delivered_at": now().isoformat(), "last_error": None, "next_at": None}
        else:
            state["last_error"] = error
            if attempt >= settings.callback_attempts:
                state |= {"gave_up": True, "next_at": None}
            else:
                delay = settings.callback_backoff_s * 2 ** (attempt - 1)
                state["next_at"] = (now() + timedelta(seconds=delay)).isoformat()
        task.callback_state = state
        return int(error is None)
