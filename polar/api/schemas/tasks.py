"""Replies about tasks: submitted, listed, one with its rollouts, cancelled (``/v1/tasks``).

Timestamps are ISO 8601 strings as ``datetime.isoformat`` writes them (UTC, ``+00:00``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from db.enums import TaskStatus
from polar.api.schemas.base import Reply
from polar.api.schemas.rollouts import RolloutView


class SubmittedTask(Reply):
    task_id: str
    name: str | None
    rollout_ids: list[str] = Field(description="one per sample, in sample order")


class Submitted(Reply):
    """``POST /v1/tasks`` and ``/v1/tasks/import``: the tasks in request order (a retry with the same
    ``Idempotency-Key``: the first submission's)."""

    tasks: list[SubmittedTask]


class TaskSummary(Reply):
    task_id: str
    name: str | None
    status: TaskStatus
    num_samples: int
    created_at: str | None
    finished_at: str | None


class TaskList(Reply):
    tasks: list[TaskSummary] = Field(description="newest first")


class TaskRollout(RolloutView):
    flow_run_state: str | None = Field(
        default=None,
        description="the flow run's state on the Prefect server; present only under deployment dispatch",
    )


class TaskView(Reply):
    task_id: str
    name: str | None
    status: TaskStatus
    priority: int
    num_samples: int
    builder: str
    metadata: dict[str, Any]
    counts: dict[str, int] = Field(description="its rollouts by status")
    mean_reward: float | None = Field(description="over rollouts with a reward, ERROR ones left out")
    held: str | None = Field(description="why admission control holds it back (POLAR_MAX_ASYNC_LEVEL), if it does")
    claim_id: str | None = Field(description="the trainer claim that holds or consumed its group")
    created_at: str | None
    dispatched_at: str | None
    dispatcher: str | None
    finished_at: str | None
    callback: dict[str, Any] | None = Field(description="its webhook's delivery state (polar.api.callbacks)")
    rollouts: list[TaskRollout]


class Cancelled(Reply):
    task_id: str
    status: TaskStatus = Field(description="CANCELLED, or the status it had already finished with")
    cancelled_rollouts: list[str]
