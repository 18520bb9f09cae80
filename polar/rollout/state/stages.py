"""A rollout's stages in its row: begin, record progress, finish, fail, reopen; and the task's status that follows
from its rollouts'."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task
from db.stage_results import Failure, RunProgress, StageResult, checked_stage_result
from db.stage_timings import StageHost, StageTimings
from polar.clock import now
from polar.errors import StageOrderError
from polar.rollout.state.view import STAGES, RolloutView, Stage, _owned, _view


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
        # Where it ran (the parent is the worker that started this flow process, if any).
        where = StageHost(host=socket.gethostname(), pid=os.getpid(), ppid=os.getppid())
        timing = view.timings.stage(stage).begun(at, where)
        row.stage_timings = {**(row.stage_timings or {}), stage.value: timing.as_json()}
        row.status = stage.status
        row.heartbeat_at = at
        db.flush()
        return StageStart(_view(db, row, default_timeout_s), skipped=False)


def enter_stage(factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str) -> None:
    """The rollout holds ``stage``'s slot: its status becomes the stage's now, before the stage begins, so the
    store never shows it in the READY buffer (``INIT``) after it gave its ready slot back."""
    with session_scope(factory) as db:
        _owned(db, rollout_id, owner).status = stage.status


def record_progress(factory: sessionmaker[Session], rollout_id: str, owner: str, values: RunProgress) -> None:
    """Merge ``values`` (the keys it was given) into what the run stage has recorded while running (committed
    before this returns)."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        results = row.results
        progress = results.run_progress.merged(values)
        stored = results.progress.without({Stage.RUN.value})
        row.stage_results = {**(row.stage_results or {}), "progress": {**stored, Stage.RUN.value: progress.as_json()}}
        row.heartbeat_at = now()


@dataclass(frozen=True)
class StageOutput:
    """What a stage hands back: its result, and for the last stage the rollout's final status and reward."""

    result: StageResult
    status: RolloutStatus | None = None
    reward: float | None = None
    error: str | None = None


def finish_stage(
    factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, output: StageOutput
) -> None:
    at = now()
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        timing = StageTimings.of(row.stage_timings).stage(stage).ended(at)
        row.stage_timings = {**(row.stage_timings or {}), stage.value: timing.as_json()}
        row.stage_results = {**(row.stage_results or {}), stage.value: checked_stage_result(stage.value, output.result)}
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
        failure = Failure(stage=stage.value, error=error, at=at.isoformat())
        row.stage_results = {**(row.stage_results or {}), "failure": failure.as_json()}
        row.status = RolloutStatus.ERROR
        row.error = f"{stage.value} failed: {error}"
        row.finished_at = at
        row.heartbeat_at = at
        _update_task_status(db, row.task_id)


def reopen_stage(
    factory: sessionmaker[Session], rollout_id: str, stage: Stage, owner: str, *, keep_progress: tuple[Stage, ...] = ()
) -> None:
    """Make a done stage (and every later one) run again, e.g. init when the runtime is gone. ``keep_progress``:
    later stages whose progress stays (a harness launch the run stage must still account for)."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)
        later = {s.value for s in STAGES[STAGES.index(stage) :]}
        kept = {s.value for s in keep_progress}
        progress = row.results.progress.without(later - kept)
        results = {k: v for k, v in (row.stage_results or {}).items() if k not in later}
        row.stage_results = {**results, "progress": progress}
        row.stage_timings = {k: v for k, v in (row.stage_timings or {}).items() if k not in later}
        row.stage = stage.previous.value if stage.previous else None


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


def _unstarted(rollout_ids: Sequence[str]) -> tuple[sa.ColumnElement[bool], ...]:
    """The rollouts of ``rollout_ids`` that no flow run has claimed (PENDING, no owner), as a WHERE clause."""
    return (Rollout.id.in_(list(rollout_ids)), Rollout.status == RolloutStatus.PENDING, Rollout.flow_run_id.is_(None))


def never_started(factory: sessionmaker[Session], rollout_ids: Sequence[str]) -> list[str]:
    """The rollouts of ``rollout_ids`` that no flow run has claimed (PENDING, no owner), in the given order."""
    if not rollout_ids:
        return []
    with factory() as db:
        found = set(db.scalars(sa.select(Rollout.id).where(*_unstarted(rollout_ids))))
    return [rollout_id for rollout_id in rollout_ids if rollout_id in found]


def cancel_unstarted(factory: sessionmaker[Session], rollout_ids: Sequence[str], reason: str) -> list[str]:
    """Mark the rollouts of ``rollout_ids`` that no flow run has claimed yet (PENDING, no owner) CANCELLED with
    ``reason``; returns their ids. A stopped batch's rollouts that never started end so, not left PENDING."""
    at = now()
    cancelled: list[str] = []
    with session_scope(factory) as db:
        rows = db.scalars(sa.select(Rollout).where(*_unstarted(rollout_ids)).with_for_update()).all()
        for row in rows:
            row.status, row.error, row.finished_at = RolloutStatus.CANCELLED, reason, at
            cancelled.append(row.id)
        for task_id in sorted({row.task_id for row in rows if row.task_id}):
            _update_task_status(db, task_id)
    return cancelled
