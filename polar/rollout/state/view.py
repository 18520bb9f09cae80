"""What the stages read about a rollout: the stages, ``RolloutView`` (a snapshot of its row) and the row lookups
the other state modules share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Rollout, Task
from db.stage_results import Failure, RunResult, StageResults
from db.stage_timings import StageTimings
from polar.clock import now
from polar.errors import NotFound, RolloutClaimed
from polar.rollout.spec import TaskRequest


class Stage(StrEnum):
    INIT = "init"
    RUN = "run"
    POSTRUN = "postrun"
    EVALUATE = "evaluate"

    @property
    def status(self) -> RolloutStatus:
        return _STAGE_STATUS[self]

    @property
    def previous(self) -> Stage | None:
        index = STAGES.index(self)
        return STAGES[index - 1] if index else None


STAGES: tuple[Stage, ...] = (Stage.INIT, Stage.RUN, Stage.POSTRUN, Stage.EVALUATE)
_STAGE_STATUS = {
    Stage.INIT: RolloutStatus.INIT,
    Stage.RUN: RolloutStatus.RUNNING,
    Stage.POSTRUN: RolloutStatus.POSTRUN,
    Stage.EVALUATE: RolloutStatus.EVALUATING,
}
# The stages the shared deadline covers; postrun and evaluate always get their own time, so the work of a
# rollout that ran out of time is still kept and scored.
DEADLINE_STAGES = (Stage.INIT, Stage.RUN)


@dataclass(frozen=True)
class RolloutView:
    """What the stages read about a rollout (a snapshot; the row stays the authority). Its JSON columns are read
    once, here (``_view``), as records: ``results`` (``stage_results``) and ``timings`` (``stage_timings``)."""

    id: str
    task_id: str
    sample_index: int
    task: TaskRequest
    status: RolloutStatus
    results: StageResults
    timings: StageTimings
    attempt: int
    owner: str | None
    deadline_at: datetime | None
    policy: Mapping[str, Any] | None = field(default=None)  # the gateway session's policy, if any

    @property
    def done(self) -> frozenset[Stage]:
        return frozenset(s for s in STAGES if self.timings.finished(s))

    @property
    def run(self) -> RunResult:
        """The run stage's result, for the stages after it (which start only once it finished)."""
        run = self.results.run
        assert run is not None, f"rollout {self.id}: the run stage has not finished"
        return run

    def remaining_s(self, at: datetime | None = None) -> float:
        """Seconds left before the shared deadline (init + run)."""
        if self.deadline_at is None:
            return self.timeout_s
        return (self.deadline_at - (at or now())).total_seconds()

    @property
    def timeout_s(self) -> float:
        assert self.task.timeout_s is not None  # filled from the settings when the view is loaded
        return self.task.timeout_s

    @property
    def failure(self) -> Failure | None:
        return self.results.failure


def _task_request(task: Task, default_timeout_s: float) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "name": task.name,
            "instruction": task.instruction,
            "harness": task.harness,
            "runtime": task.runtime,
            "evaluator": task.evaluator,
            "builder": task.builder,
            "num_samples": task.num_samples,
            "timeout_s": task.timeout_s or default_timeout_s,
            "agent_timeout_s": task.agent_timeout_s,
            "priority": task.priority,
            "metadata": task.meta or {},
        }
    )


def _view(db: Session, row: Rollout, default_timeout_s: float) -> RolloutView:
    if row.task_id is None:
        raise NotFound(
            f"rollout {row.id} belongs to no task; only task rollouts run through the pipeline", field="rollout_id"
        )
    task = db.get(Task, row.task_id)
    assert task is not None  # the foreign key guarantees it
    return RolloutView(
        id=row.id,
        task_id=row.task_id,
        sample_index=row.sample_index,
        task=_task_request(task, default_timeout_s),
        status=RolloutStatus(row.status),
        results=row.results,
        timings=StageTimings.of(row.stage_timings),
        attempt=row.attempt,
        owner=row.flow_run_id,
        deadline_at=row.deadline_at,
        policy=(row.policy or {}).get("policy"),
    )


def _row(db: Session, rollout_id: str, *, lock: bool = True) -> Rollout:
    row = db.get(Rollout, rollout_id, with_for_update=lock)
    if row is None:
        raise NotFound(f"no rollout {rollout_id!r}", field="rollout_id")
    return row


def _owned(db: Session, rollout_id: str, owner: str) -> Rollout:
    row = _row(db, rollout_id)
    if row.flow_run_id != owner:
        raise RolloutClaimed(
            f"rollout {rollout_id} is owned by flow run {row.flow_run_id}, not {owner}", field="rollout_id"
        )
    return row


def load(factory: sessionmaker[Session], rollout_id: str, *, default_timeout_s: float) -> RolloutView:
    with session_scope(factory) as db:
        return _view(db, _row(db, rollout_id, lock=False), default_timeout_s)
