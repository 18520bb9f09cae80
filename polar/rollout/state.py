"""A rollout's progress in its row: who owns it, which stages are done, what each returned and how long it took.

The row is the authority, not Prefect's task results, so any flow run on any worker can resume a rollout.

- ``claim``: a flow run takes the rollout (``flow_run_id``), with one atomic conditional UPDATE, so two flow runs
  of one rollout never both run it. A different owner may take over only when asked to (the retry flow) or
  when the current owner's heartbeat is older than ``stale_after_s``. Claiming arms the shared deadline of init
  and run: the task's ``timeout_s`` minus the time init and run already spent in earlier attempts (time spent
  waiting in between is free).
- ``begin_stage``/``finish_stage``: a stage is done once ``stage_timings[stage]["finished_at"]`` is set; its
  result is then ``stage_results[stage]``. A stage that is already done is skipped, one whose predecessor is not
  done is refused. ``stage_results["progress"][stage]`` holds what a stage records while it runs (the run stage
  records the harness launch there before starting it, so a resumed run knows it must not launch again).
- ``mark_failed``: a stage failed for good; the rollout becomes ERROR with ``stage_results["failure"]`` naming
  the stage, which is what the retry flow looks for. The next ``claim`` resumes it at that stage.

Functions are synchronous (call them through ``asyncio.to_thread`` from async code) and each runs in its own
transaction. JSON columns are always reassigned, never mutated in place, so SQLAlchemy writes them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import rows_matched, session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task
from polar.clock import now
from polar.errors import NotFound, RolloutClaimed, StageOrderError
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
    """What the stages read about a rollout (a snapshot; the row stays the authority)."""

    id: str
    task_id: str
    sample_index: int
    task: TaskRequest
    status: RolloutStatus
    stage_results: Mapping[str, Any]
    stage_timings: Mapping[str, Any]
    attempt: int
    owner: str | None
    deadline_at: datetime | None
    policy: Mapping[str, Any] | None = field(default=None)  # the gateway session's policy, if any

    @property
    def done(self) -> frozenset[Stage]:
        return frozenset(s for s in STAGES if (self.stage_timings.get(s.value) or {}).get("finished_at"))

    def result(self, stage: Stage) -> Mapping[str, Any]:
        return self.stage_results.get(stage.value) or {}

    def progress(self, stage: Stage) -> Mapping[str, Any]:
        return (self.stage_results.get("progress") or {}).get(stage.value) or {}

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
    def failure(self) -> Mapping[str, Any] | None:
        return self.stage_results.get("failure")


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
        stage_results=dict(row.stage_results or {}),
        stage_timings=dict(row.stage_timings or {}),
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


def _spent_s(timings: Mapping[str, Any], stages: Sequence[Stage]) -> float:
    return sum(float((timings.get(s.value) or {}).get("duration_s") or 0.0) for s in stages)


def claim(
    factory: sessionmaker[Session],
    rollout_id: str,
    owner: str,
    *,
    default_timeout_s: float,
    stale_after_s: float,
    takeover: bool = False,
) -> RolloutView:
    """Make ``owner`` the rollout's flow run and arm its deadline; a finished rollout is returned untouched.

    Raises ``RolloutClaimed`` when another flow run holds it (and neither ``takeover`` nor staleness allows
    taking it), ``NotFound`` for an unknown rollout.
    """
    at = now()
    with session_scope(factory) as db:
        row = _row(db, rollout_id, lock=False)
        if RolloutStatus(row.status).is_terminal and not (row.stage_results or {}).get("failure"):
            return _view(db, row, default_timeout_s)
        free = (
            (Rollout.flow_run_id.is_(None))
            | (Rollout.flow_run_id == owner)
            | (Rollout.heartbeat_at < at - timedelta(seconds=stale_after_s))
        )
        condition = sa.true() if takeover else free
        claimed = rows_matched(
            db,
            sa.update(Rollout)
            .where(Rollout.id == rollout_id, condition)
            .values(flow_run_id=owner, attempt=Rollout.attempt + 1, heartbeat_at=at)
            .execution_options(synchronize_session=False),
        )
        if not claimed:
            raise RolloutClaimed(f"rollout {rollout_id} is owned by flow run {row.flow_run_id}", field="rollout_id")
        db.expire(row)
        row = _row(db, rollout_id)
        _clear_failure(row)
        view = _view(db, row, default_timeout_s)
        left = max(0.0, view.timeout_s - _spent_s(row.stage_timings or {}, DEADLINE_STAGES))
        row.deadline_at = at + timedelta(seconds=left)
        row.started_at = row.started_at or at
        db.flush()
        return _view(db, row, default_timeout_s)


@dataclass(frozen=True)
class StageStart:
    view: RolloutView
    skipped: bool


def begin_stage(
    factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, *, default_timeout_s: float
) -> StageStart:
    """Start ``stage`` (or report it done already). Raises ``StageOrderError`` if its predecessor is not done."""
    at = now()
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        view = _view(db, row, default_timeout_s)
        if stage in view.done:
            return StageStart(view, skipped=True)
        if stage.previous is not None and stage.previous not in view.done:
            raise StageOrderError(
                f"rollout {rollout_id}: {stage} cannot start before {stage.previous} is done", field="stage"
            )
        timing = dict(view.stage_timings.get(stage.value) or {})
        timing["started_at"] = at.isoformat()
        timing["attempts"] = int(timing.get("attempts", 0)) + 1
        # Where it ran (the parent is the worker that started this flow process, if any).
        timing["where"] = {"host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid()}
        row.stage_timings = {**view.stage_timings, stage.value: timing}
        row.status = stage.status
        row.heartbeat_at = at
        db.flush()
        return StageStart(_view(db, row, default_timeout_s), skipped=False)


def record_progress(
    factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, values: Mapping[str, Any]
) -> None:
    """Merge ``values`` into what ``stage`` has recorded while running (committed before this returns)."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        results = dict(row.stage_results or {})
        progress = dict(results.get("progress") or {})
        progress[stage.value] = {**(progress.get(stage.value) or {}), **values}
        results["progress"] = progress
        row.stage_results = results
        row.heartbeat_at = now()


def heartbeat(factory: sessionmaker[Session], rollout_id: str, owner: str) -> None:
    with session_scope(factory) as db:
        db.execute(
            sa.update(Rollout).where(Rollout.id == rollout_id, Rollout.flow_run_id == owner).values(heartbeat_at=now())
        )


@dataclass(frozen=True)
class StageOutput:
    """What a stage hands back: its result, and for the last stage the rollout's final status and reward."""

    result: Mapping[str, Any]
    status: RolloutStatus | None = None
    reward: float | None = None
    error: str | None = None


def finish_stage(
    factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, output: StageOutput
) -> None:
    at = now()
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        timings = dict(row.stage_timings or {})
        timing = dict(timings.get(stage.value) or {})
        started = datetime.fromisoformat(timing.get("started_at") or at.isoformat())
        timing.update(finished_at=at.isoformat(), duration_s=round((at - started).total_seconds(), 4))
        timings[stage.value] = timing
        row.stage_timings = timings
        row.stage_results = {**(row.stage_results or {}), stage.value: dict(output.result)}
        row.stage = stage.value
        row.heartbeat_at = at
        if output.status is not None:
            row.status = output.status
            row.reward = output.reward
            row.error = output.error
            row.finished_at = at
            _update_task_status(db, row.task_id)


def mark_failed(factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, error: str) -> None:
    """``stage`` failed after its retries: the rollout is ERROR until the retry flow resumes it at ``stage``."""
    at = now()
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        row.stage_results = {
            **(row.stage_results or {}),
            "failure": {"stage": stage.value, "error": error, "at": at.isoformat()},
        }
        row.status = RolloutStatus.ERROR
        row.error = f"{stage.value} failed: {error}"
        row.finished_at = at
        row.heartbeat_at = at
        _update_task_status(db, row.task_id)


def reopen_stage(factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str) -> None:
    """Make a done stage (and every later one) run again, e.g. init when the runtime is gone."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        later = {s.value for s in STAGES[STAGES.index(stage) :]}
        results = {k: v for k, v in (row.stage_results or {}).items() if k not in later}
        results["progress"] = {k: v for k, v in (results.get("progress") or {}).items() if k not in later}
        row.stage_timings = {k: v for k, v in (row.stage_timings or {}).items() if k not in later}
        row.stage_results = results
        row.stage = stage.previous.value if stage.previous else None


def select_retryable(
    factory: sessionmaker[Session],
    *,
    rollout_ids: Sequence[str] | None = None,
    task_id: str | None = None,
    stale_after_s: float | None = None,
) -> list[str]:
    """Rollouts to retry: those whose pipeline failed (``mark_failed``) and, with ``stale_after_s``, unfinished
    ones whose owner has been silent that long (a killed flow run, or a batch that died before dispatching)."""
    query = sa.select(
        Rollout.id, Rollout.status, Rollout.stage_results, Rollout.heartbeat_at, Rollout.created_at
    ).where(Rollout.task_id.is_not(None))
    if rollout_ids is not None:
        query = query.where(Rollout.id.in_(list(rollout_ids)))
    if task_id is not None:
        query = query.where(Rollout.task_id == task_id)
    stale_before = now() - timedelta(seconds=stale_after_s) if stale_after_s is not None else None
    chosen = []
    with session_scope(factory) as db:
        for rollout_id, status, results, heartbeat_at, created_at in db.execute(
            query.order_by(Rollout.created_at, Rollout.id)
        ):
            if (
                (results or {}).get("failure")
                or stale_before is not None
                and not RolloutStatus(status).is_terminal
                and (heartbeat_at or created_at) <= stale_before
            ):
                chosen.append(rollout_id)
    return chosen


def _clear_failure(row: Rollout) -> None:
    """A claimed rollout that had failed resumes: its failure moves to ``previous_failures``."""
    results = dict(row.stage_results or {})
    failure = results.pop("failure", None)
    if failure is None:
        return
    failed = Stage(failure["stage"])
    row.stage_results = {**results, "previous_failures": [*results.get("previous_failures", []), failure]}
    row.status = failed.previous.status if failed.previous else RolloutStatus.PENDING
    row.error = None
    row.finished_at = None


def _update_task_status(db: Session, task_id: str | None) -> None:
    if task_id is None:
        return
    db.flush()
    # Lock the task first: two of its rollouts finishing at once would otherwise each miss the other's (not yet
    # committed) final status, and both leave the task RUNNING. Under the lock, the statuses read are committed.
    task = db.get(Task, task_id, with_for_update=True)
    if task is None:
        return
    statuses = [RolloutStatus(s) for s in db.scalars(sa.select(Rollout.status).where(Rollout.task_id == task_id))]
    if task.status is TaskStatus.CANCELLED:
        return
    if statuses and all(s.is_terminal for s in statuses):
        task.status = TaskStatus.COMPLETED if RolloutStatus.COMPLETED in statuses else TaskStatus.FAILED
        task.finished_at = task.finished_at or now()
    else:
        task.status = TaskStatus.RUNNING
