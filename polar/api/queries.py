"""Read models of the control API: tasks with their rollouts, and trajectories with filters.

Plain dicts of JSON-ready values; the routes wrap them in their reply models (``polar.api.schemas``), which
declare every key, in this order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus, TaskStatus
from db.models import Evaluation, Rollout, Task, Trajectory
from polar.api.runner import held_reason
from polar.errors import NotFound
from polar.evaluators.components import reward_components
from polar.export.filters import ExportFilter, apply
from polar.feed import versions


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def rollout_view(row: Rollout) -> dict[str, Any]:
    return {
        "rollout_id": row.id,
        "task_id": row.task_id,
        "sample_index": row.sample_index,
        "status": row.status.value,
        "stage": row.stage,
        "reward": row.reward,
        "error": row.error,
        "attempt": row.attempt,
        "weight_version_min": row.weight_version_min,
        "weight_version_max": row.weight_version_max,
        "flow_run_id": row.dispatch_id,
        "stage_timings": row.stage_timings or {},
        "created_at": _iso(row.created_at),
        "finished_at": _iso(row.finished_at),
    }


def evaluations_view(db: Session, rollout_id: str) -> list[dict[str, Any]]:
    """The rollout's evaluations, each with its typed reward components beside the raw details."""
    rows = db.scalars(sa.select(Evaluation).where(Evaluation.rollout_id == rollout_id).order_by(Evaluation.id))
    return [
        {
            "evaluator": row.evaluator,
            "reward": row.reward,
            "duration_s": row.duration_s,
            "components": reward_components(row.evaluator, row.reward, row.details).model_dump(),
            "details": row.details,
        }
        for row in rows
    ]


def task_view(db: Session, task_id: str, max_async_level: int | None) -> dict[str, Any]:
    task = db.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}", field="task_id")
    rollouts = db.scalars(sa.select(Rollout).where(Rollout.task_id == task_id).order_by(Rollout.sample_index)).all()
    counts: dict[str, int] = {}
    for row in rollouts:
        counts[row.status.value] = counts.get(row.status.value, 0) + 1
    # ERROR rollouts (infrastructure failures) are left out of the group's statistics.
    rewards = [row.reward for row in rollouts if row.reward is not None and row.status is not RolloutStatus.ERROR]
    held = None
    if task.dispatched_at is None and task.status is TaskStatus.PENDING:
        held = held_reason((task.meta or {}).get("step"), len(versions.ordinals(db)), max_async_level)
    return {
        "task_id": task.id,
        "name": task.name,
        "status": task.status.value,
        "priority": task.priority,
        "num_samples": task.num_samples,
        "builder": task.builder,
        "metadata": task.meta or {},
        "counts": counts,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "held": held,
        "claim_id": task.claim_id,
        "created_at": _iso(task.created_at),
        "dispatched_at": _iso(task.dispatched_at),
        "dispatcher": task.dispatcher,
        "finished_at": _iso(task.finished_at),
        "callback": task.callback_state,
        "rollouts": [rollout_view(row) for row in rollouts],
    }


def list_tasks(db: Session, *, status: TaskStatus | None, limit: int, offset: int) -> list[dict[str, Any]]:
    query = sa.select(Task).order_by(Task.created_at.desc(), Task.id).limit(limit).offset(offset)
    if status is not None:
        query = query.where(Task.status == status)
    return [
        {
            "task_id": t.id,
            "name": t.name,
            "status": t.status.value,
            "num_samples": t.num_samples,
            "created_at": _iso(t.created_at),
            "finished_at": _iso(t.finished_at),
        }
        for t in db.scalars(query)
    ]


def trajectory_view(row: Trajectory, task_id: str | None, *, tokens: bool) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": row.id,
        "rollout_id": row.rollout_id,
        "task_id": task_id,
        "builder": row.builder,
        "chain_index": row.chain_index,
        "status": row.status,
        "reward": row.reward,
        "turn_count": row.turn_count,
        "n_prompt": row.n_prompt,
        "n_response": row.n_response,
        "n_loss_tokens": row.n_loss_tokens,
        "finish_reason": row.finish_reason,
        "filter_reason": row.filter_reason,
        "role": row.role,
        "source_capture_id": row.source_capture_id,
        "compacted": row.compacted,
        "kept": row.kept,
        "weight_version_min": row.weight_version_min,
        "weight_version_max": row.weight_version_max,
        "consumed_by": row.consumed_by,
        "created_at": _iso(row.created_at),
    }
    if tokens:
        item |= {
            "prompt_ids": list(row.prompt_ids),
            "response_ids": list(row.response_ids),
            "loss_mask": list(row.loss_mask),
            "response_logprobs": list(row.response_logprobs),
            "sampling_spans": row.sampling_spans,
        }
    return item


def list_trajectories(
    db: Session, filters: ExportFilter, *, limit: int, offset: int, tokens: bool
) -> list[dict[str, Any]]:
    """Trajectories matching ``filters`` (the exports' filters), oldest first."""
    query = (
        sa.select(Trajectory, Rollout.task_id)
        .join(Rollout, Rollout.id == Trajectory.rollout_id)
        .join(Task, Task.id == Rollout.task_id, isouter=True)  # a session without a task has trajectories too
    )
    query = apply(query, filters, db.get_bind().dialect.name).order_by(Trajectory.id).limit(limit).offset(offset)
    return [trajectory_view(row, task_id, tokens=tokens) for row, task_id in db.execute(query)]
