"""Submission: validated task requests become a ``tasks`` row each and ``num_samples`` ``rollouts`` rows.

Each rollout is one sample and, once it runs, one gateway session. A sample's session policy (when the task
has ``policies``) is stored on its rollout row, where the run stage finds it. Everything is validated before
anything is written, and all rows go in one transaction: a bad task in a batch stores nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task
from polar.errors import InvalidRequest
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


def submit_tasks(
    factory: sessionmaker[Session], requests: Sequence[TaskRequest | dict[str, Any]]
) -> list[SubmittedTask]:
    """Store the tasks and their rollouts (status PENDING); returns their ids, in submission order."""
    tasks = validate_tasks(requests)
    submitted = []
    with session_scope(factory) as db:
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
                    policy={"policy": policy, "models": []} if policy is not None else None,
                )
                db.add(rollout)
                rollouts.append(rollout)
            db.flush()
            submitted.append(SubmittedTask(task.id, request.name, request.priority, tuple(r.id for r in rollouts)))
    return submitted


def dispatch_order(submitted: Sequence[SubmittedTask]) -> list[str]:
    """Rollout ids in the order to start them: higher task priority first, then submission order."""
    ranked = sorted(enumerate(submitted), key=lambda item: (-item[1].priority, item[0]))
    return [rollout_id for _, task in ranked for rollout_id in task.rollout_ids]
