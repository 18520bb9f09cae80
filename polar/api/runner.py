"""Starting and cancelling submitted tasks for the control API.

``TaskRunner.tick`` admits tasks (admission control) and starts their rollouts:

- ``deployment``: one flow run of the rollout deployment (``POLAR_ROLLOUT_DEPLOYMENT``) per rollout, which any
  worker on the pool picks up; the flow run's id is kept in ``rollouts.dispatch_id``. Before its first flow
  run the runner creates the fleet-wide stage limits (``polar.rollout.fleet_limits``) if they are missing, so
  control-API rollouts never meet limits that do not exist.
- ``inline``: the rollout flows run in this process (Prefect's ephemeral mode), as one asyncio task per task.

Admission: with ``POLAR_MAX_ASYNC_LEVEL = N`` a task whose ``metadata.step`` is more than ``N`` ahead of the
current weight-version ordinal waits (PENDING, not dispatched) until the trainer registers enough versions.
A task is taken for dispatch by a conditional update of ``tasks.dispatcher`` (``polar.rollout.dispatcher``):
only tasks stored without a runner are taken, so two API replicas never start the same task, and the tasks a
``polar run`` on the same store submitted (owned by it from the insert) are never started here.

``cancel`` marks the task and its unfinished rollouts CANCELLED and closes (revokes) their gateway sessions in
the same transaction, before anything else (a rollout's owner is reset, so a flow still running can no longer
write its stages) and stops the flow runs: in-process ones are cancelled, deployment
runs are set Cancelled, or Cancelling when a worker is running them (the worker then kills the process).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task
from polar.api.schemas import Cancelled
from polar.clock import now
from polar.errors import NotConfigured, NotFound
from polar.feed import versions
from polar.prefect_adapter import cancel_flow_runs, ensure_limits, start_deployment_run
from polar.rollout.dispatcher import new_dispatcher, take
from polar.rollout.fleet_limits import limit_scope, warn_unbounded
from polar.settings import LimitScope, Settings, TaskDispatch
from polar.store_bound import in_store

log = logging.getLogger(__name__)
CANCELLED_OWNER = "cancelled"


def resolve_dispatch(settings: Settings) -> TaskDispatch:
    if settings.task_dispatch is not TaskDispatch.AUTO:
        return settings.task_dispatch
    return TaskDispatch.DEPLOYMENT if settings.prefect_api_url else TaskDispatch.INLINE


def held_reason(step: Any, current_ordinal: int, max_async_level: int | None) -> str | None:
    """Why a task may not start yet (None: it may)."""
    if max_async_level is None or not isinstance(step, int) or isinstance(step, bool):
        return None
    if step <= current_ordinal + max_async_level:
        return None
    return f"metadata.step {step} is more than {max_async_level} ahead of weight version ordinal {current_ordinal}"


def take_admissible(
    factory: sessionmaker[Session], max_async_level: int | None, dispatcher: str
) -> list[tuple[str, list[str]]]:
    """Take every admissible task no runner holds for ``dispatcher``; returns (task id, rollout ids) in priority
    order."""
    taken = []
    with session_scope(factory) as db:
        current = len(versions.ordinals(db))
        tasks = db.execute(
            sa.select(Task.id, Task.meta)
            .where(Task.dispatcher.is_(None), Task.status == TaskStatus.PENDING)
            .order_by(Task.priority.desc(), Task.created_at, Task.id)
        ).all()
        for task_id, meta in tasks:
            if held_reason((meta or {}).get("step"), current, max_async_level) is not None:
                continue
            if take(db, task_id, dispatcher):
                ids = db.scalars(sa.select(Rollout.id).where(Rollout.task_id == task_id).order_by(Rollout.sample_index))
                taken.append((task_id, list(ids)))
    return taken


def mark_cancelled(factory: sessionmaker[Session], task_id: str) -> tuple[TaskStatus, list[tuple[str, str | None]]]:
    """Cancel a task's unfinished rollouts in the store; returns the task's status and (rollout, dispatch id) of
    those cancelled. A task that already finished is left as it is."""
    at = now()
    with session_scope(factory) as db:
        task = db.get(Task, task_id, with_for_update=True)
        if task is None:
            raise NotFound(f"no task {task_id}", field="task_id")
        if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
            return task.status, []
        rows = db.scalars(sa.select(Rollout).where(Rollout.task_id == task_id).with_for_update()).all()
        cancelled = []
        for row in rows:
            if RolloutStatus(row.status).is_terminal:
                continue
            row.status, row.error, row.finished_at = RolloutStatus.CANCELLED, "cancelled through the control API", at
            row.flow_run_id = CANCELLED_OWNER
            row.closed_at = row.closed_at or at  # revoke the gateway session first: its harness is cut off now
            cancelled.append((row.id, row.dispatch_id))
        task.status, task.finished_at = TaskStatus.CANCELLED, at
        return task.status, cancelled


# Runs rollouts to their final status in this process, as the given dispatcher; the Prefect layer provides it
# (``flows.dispatch.run_inline``), passed in by whoever builds the app, since the library never imports the flows.
InlineDispatch = Callable[[list[str], Settings, str], Awaitable[object]]


class TaskRunner:
    def __init__(self, settings: Settings, factory: sessionmaker[Session], run_inline: InlineDispatch | None = None):
        self.settings = settings
        self.factory = factory
        self.mode = resolve_dispatch(settings)
        if self.mode is TaskDispatch.INLINE and run_inline is None:
            raise NotConfigured("inline task dispatch needs the rollout flows: build the app with run_inline")
        self._run_rollouts = run_inline
        self.dispatcher = new_dispatcher("api")
        self._inline: dict[str, asyncio.Task[Any]] = {}
        self._limits_ready = False

    async def tick(self) -> list[str]:
        """Admit and start what may start now; returns the task ids started."""
        taken = await asyncio.to_thread(take_admissible, self.factory, self.settings.max_async_level, self.dispatcher)
        for task_id, rollout_ids in taken:
            if self.mode is TaskDispatch.DEPLOYMENT:
                await self._create_flow_runs(rollout_ids)
            else:
                self._inline[task_id] = asyncio.create_task(self._run_inline(task_id, rollout_ids))
        return [task_id for task_id, _ in taken]

    async def _run_inline(self, task_id: str, rollout_ids: list[str]) -> None:
        assert self._run_rollouts is not None  # checked in __init__ for inline mode
        try:
            await self._run_rollouts(rollout_ids, self.settings, self.dispatcher)
        except Exception:
            log.exception("dispatching task %s failed", task_id)
        finally:
            self._inline.pop(task_id, None)

    async def ensure_fleet_limits(self) -> None:
        """Create the fleet-wide stage limits once (resizing them to these settings), before the first flow run."""
        if self._limits_ready:
            return
        if limit_scope(self.settings) is LimitScope.PREFECT:
            await ensure_limits(self.settings)
        else:
            warn_unbounded(self.settings, "control API deployment dispatch")
        self._limits_ready = True

    async def _create_flow_runs(self, rollout_ids: list[str]) -> None:
        await self.ensure_fleet_limits()
        for rollout_id in rollout_ids:
            run_id = await start_deployment_run(
                self.settings.rollout_deployment, {"rollout_id": rollout_id}, f"polar-api-rollout-{rollout_id}"
            )
            await asyncio.to_thread(self._record_dispatch, rollout_id, run_id)

    def _record_dispatch(self, rollout_id: str, flow_run_id: str) -> None:
        with session_scope(self.factory) as db:
            db.execute(sa.update(Rollout).where(Rollout.id == rollout_id).values(dispatch_id=flow_run_id))

    async def cancel(self, task_id: str) -> Cancelled:
        timeout_s = self.settings.store_statement_timeout_s  # a frozen store: a 503, not a hang
        status, cancelled = await in_store(mark_cancelled, self.factory, task_id, timeout_s=timeout_s)
        inline = self._inline.pop(task_id, None)
        if inline is not None:
            inline.cancel()
        flow_runs = [dispatch_id for _, dispatch_id in cancelled if dispatch_id]
        if flow_runs:
            await cancel_flow_runs(flow_runs)
        return Cancelled(task_id=task_id, status=status, cancelled_rollouts=[r for r, _ in cancelled])

    async def aclose(self) -> None:
        for task in list(self._inline.values()):
            task.cancel()
        await asyncio.gather(*self._inline.values(), return_exceptions=True)
