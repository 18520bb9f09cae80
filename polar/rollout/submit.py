"""Submission: validated task requests become a ``tasks`` row each and ``num_samples`` ``rollouts`` rows.

Each rollout is one sample and, once it runs, one gateway session. A sample's session policy (when the task
has ``policies``) is stored on its rollout row, where the run stage finds it. Everything is validated before
anything is written, and all rows go in one transaction: a bad task in a batch stores nothing.

With an idempotency key (the control API's ``Idempotency-Key`` header) the key is stored in that same transaction
with a hash of the batch, so a client that retries after a timeout gets the tasks of its first attempt, never a
duplicate; the same key with a different batch is a ``Conflict``.

A runner that stores tasks to run them itself passes its ``dispatcher`` id: the tasks are stored already owned
by it (``tasks.dispatcher``, ``dispatched_at``), so no other runner (a ``polar serve`` on the same store) ever
takes them. Without one they wait for the control API's runner (``polar.rollout.dispatcher``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Submission, Task
from polar.capture_extras import CaptureOptions
from polar.clock import now
from polar.errors import Conflict, InvalidRequest
from polar.rollout.spec import TaskRequest, parse_task_request


@dataclass(frozen=True)
class SubmittedTask:
    task_id: str
    name: str | None
    priority: int
    rollout_ids: tuple[str, ...]


def validate_tasks(requests: Sequence[TaskRequest | dict[str, Any]]) -> list[TaskRequest]:
    """Every request validated; an error names the task's position (``tasks.2.harness.name``)."""
    if not requests:
        raise InvalidRequest("a batch needs at least one task", field="tasks")
    validated = []
    for index, raw in enumerate(requests):
        try:
            validated.append(parse_task_request(raw))
        except InvalidRequest as exc:
            where = f"tasks.{index}" + (f".{exc.field}" if exc.field else "")
            raise InvalidRequest(f"task {index}: {exc.message}", field=where) from None
    return validated


MAX_KEY_LENGTH = 255


def _batch_sha256(tasks: Sequence[TaskRequest]) -> str:
    canonical = json.dumps([t.model_dump(mode="json") for t in tasks], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_key(key: str) -> None:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise InvalidRequest(
            f"an Idempotency-Key is 1 to {MAX_KEY_LENGTH} printable characters", field="Idempotency-Key"
        )


def _earlier(db: Session, key: str, sha256: str) -> list[SubmittedTask] | None:
    """The tasks an earlier submission with ``key`` created (None: no such submission)."""
    row = db.get(Submission, key)
    if row is None:
        return None
    if row.request_sha256 != sha256:
        raise Conflict(
            "this Idempotency-Key was already used for a different batch of tasks; use a new key for a new batch",
            field="Idempotency-Key",
        )
    tasks = {t.id: t for t in db.scalars(sa.select(Task).where(Task.id.in_(row.task_ids)))}
    out = []
    for task_id in row.task_ids:
        ids = db.scalars(sa.select(Rollout.id).where(Rollout.task_id == task_id).order_by(Rollout.sample_index))
        out.append(SubmittedTask(task_id, tasks[task_id].name, tasks[task_id].priority, tuple(ids)))
    return out


def submit_tasks(
    factory: sessionmaker[Session],
    requests: Sequence[TaskRequest | dict[str, Any]],
    *,
    idempotency_key: str | None = None,
    dispatcher: str | None = None,
) -> list[SubmittedTask]:
    """Store the tasks and their rollouts (status PENDING); returns their ids, in submission order.

    With ``dispatcher`` the tasks are stored owned by that runner (it alone starts their rollouts).

    With ``idempotency_key``, a batch already submitted under that key returns its first tasks (nothing new is
    stored); a different batch under it raises ``Conflict``.
    """
    tasks = validate_tasks(requests)
    if idempotency_key is None:
        return _store(factory, tasks, None, dispatcher)
    _check_key(idempotency_key)
    sha256 = _batch_sha256(tasks)
    with session_scope(factory) as db:
        earlier = _earlier(db, idempotency_key, sha256)
    if earlier is not None:
        return earlier
    try:
        return _store(factory, tasks, (idempotency_key, sha256), dispatcher)
    except IntegrityError:  # a concurrent retry with the same key committed first: its tasks are the answer
        with session_scope(factory) as db:
            earlier = _earlier(db, idempotency_key, sha256)
        if earlier is None:
            raise
        return earlier


def _store(
    factory: sessionmaker[Session],
    tasks: Sequence[TaskRequest],
    key: tuple[str, str] | None,
    dispatcher: str | None,
) -> list[SubmittedTask]:
    submitted = []
    dispatched_at = now() if dispatcher is not None else None
    with session_scope(factory) as db:
        if key is not None:
            # First, so a concurrent submission with the same key conflicts before any task is written.
            db.add(Submission(key=key[0], request_sha256=key[1], task_ids=[]))
            db.flush()
        for request in tasks:
            task = Task(
                name=request.name,
                instruction=request.instruction,
                harness=request.harness.model_dump(mode="json"),
                runtime=request.runtime.model_dump(mode="json", exclude_none=True),
                evaluator=request.evaluator.model_dump(mode="json", exclude_none=True),
                builder=request.builder,
                builder_options=request.builder_options.model_dump(mode="json", exclude_defaults=True) or None,
                num_samples=request.num_samples,
                timeout_s=request.timeout_s,
                agent_timeout_s=request.agent_timeout_s,
                priority=request.priority,
                meta=request.metadata,
                status=TaskStatus.PENDING,
                callback_url=request.callback_url,
                dispatcher=dispatcher,
                dispatched_at=dispatched_at,
            )
            db.add(task)
            db.flush()
            rollouts = []
            for index in range(request.num_samples):
                policy = request.policy_for(index)
                rollout = Rollout(
                    task_id=task.id,
                    sample_index=index,
                    status=RolloutStatus.PENDING,
                    stage_results={},
                    stage_timings={},
                    policy=_session_policy(policy, request.capture),
                )
                db.add(rollout)
                rollouts.append(rollout)
            db.flush()
            submitted.append(SubmittedTask(task.id, request.name, request.priority, tuple(r.id for r in rollouts)))
        if key is not None:
            db.execute(
                sa.update(Submission).where(Submission.key == key[0]).values(task_ids=[t.task_id for t in submitted])
            )
    return submitted


def _session_policy(policy: dict[str, Any] | None, capture: CaptureOptions | None) -> dict[str, Any] | None:
    """A rollout's session settings: its scripted policy and its task's capture options (kept by the gateway when
    the run stage opens the session)."""
    if policy is None and (capture is None or not capture.any):
        return None
    out: dict[str, Any] = {"policy": policy, "models": []}
    if capture is not None and capture.any:
        out["capture"] = capture.model_dump(exclude_defaults=True)
    return out


def dispatch_order(submitted: Sequence[SubmittedTask]) -> list[str]:
    """Rollout ids in the order to start them: higher task priority first, then submission order."""
    ranked = sorted(enumerate(submitted), key=lambda item: (-item[1].priority, item[0]))
    return [rollout_id for _, task in ranked for rollout_id in task.rollout_ids]
