"""``/v1/tasks``: submit tasks (as TaskRequests, or benchmark tasks on this host), list them, read one with its
rollouts, cancel one. A submission wakes the background pass, which admits and starts the tasks."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Query

from db.enums import TaskStatus
from polar.api import queries
from polar.api.deps import CONTROL, ApiState, RunnerDep, SettingsDep, StateDep, StoreDep
from polar.api.error_handlers import ERROR_RESPONSES
from polar.api.imports import TaskImport, import_requests
from polar.api.schemas import Cancelled, Submitted, SubmittedTask, TaskBatch, TaskList, TaskView
from polar.errors import InvalidRequest
from polar.prefect_adapter import flow_run_states
from polar.rollout.spec import TaskRequest
from polar.rollout.submit import submit_tasks
from polar.settings import TaskDispatch

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], dependencies=CONTROL, responses=ERROR_RESPONSES)

IdempotencyKey = Annotated[
    str | None,
    Header(max_length=255, description="a retry with the same key returns the same tasks, never duplicates"),
]


def _scripted(field: str) -> InvalidRequest:
    return InvalidRequest(
        f"{field}: scripted policies are for tests and demos and are refused here; "
        "set POLAR_ALLOW_SCRIPTED_POLICIES=1 on the control API to accept them",
        field=field,
    )


async def _submit(state: ApiState, requests: list[TaskRequest], idempotency_key: str | None) -> Submitted:
    submitted = await state.store.call(submit_tasks, state.store.factory, requests, idempotency_key=idempotency_key)
    state.wake.set()
    return Submitted(
        tasks=[SubmittedTask(task_id=t.task_id, name=t.name, rollout_ids=list(t.rollout_ids)) for t in submitted]
    )


@router.post("", status_code=201)
async def submit(batch: TaskBatch, state: StateDep, idempotency_key: IdempotencyKey = None) -> Submitted:
    if not state.settings.allow_scripted_policies:
        for index, request in enumerate(batch.tasks):
            if request.policies:
                raise _scripted(f"tasks.{index}.policies")
    return await _submit(state, batch.tasks, idempotency_key)


@router.post("/import", status_code=201)
async def submit_import(body: TaskImport, state: StateDep, idempotency_key: IdempotencyKey = None) -> Submitted:
    """Harbor task folders or a SWE-bench .jsonl file on this host (inside POLAR_COPY_ROOTS) as tasks."""
    if body.policies and not state.settings.allow_scripted_policies:
        raise _scripted("policies")
    requests = await asyncio.to_thread(import_requests, body, state.settings)
    return await _submit(state, requests, idempotency_key)


@router.get("")
async def tasks(
    store: StoreDep,
    status: TaskStatus | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=1_000_000_000),
) -> TaskList:
    return TaskList.model_validate(
        {"tasks": await store.read(queries.list_tasks, status=status, limit=limit, offset=offset)}
    )


# Unset keys are left out: a rollout's flow_run_state is there only under deployment dispatch.
@router.get("/{task_id}", response_model_exclude_unset=True)
async def task(task_id: str, store: StoreDep, settings: SettingsDep, runner: RunnerDep) -> TaskView:
    view = await store.read(queries.task_view, task_id, settings.max_async_level)
    if runner.mode is TaskDispatch.DEPLOYMENT:
        states = await flow_run_states([r["flow_run_id"] for r in view["rollouts"] if r["flow_run_id"]])
        for rollout in view["rollouts"]:
            rollout["flow_run_state"] = states.get(rollout["flow_run_id"] or "")
    return TaskView.model_validate(view)


@router.post("/{task_id}/cancel")
async def cancel(task_id: str, runner: RunnerDep) -> Cancelled:
    return await runner.cancel(task_id)
