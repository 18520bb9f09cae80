"""The SFT generation flow: a task dataset through the rollout pipeline, then an export of what was accepted.

    sft_generation(dataset="tasks.jsonl", harness={"name": "pi"}, samples_per_task=2,
                   acceptance={"min_reward": 1.0}, output="sft-exports")

Rows whose key already has an accepted conversation (from an earlier run of the same dataset name) are skipped.
The teacher is the model behind the gateway the rollouts use (``POLAR_GATEWAY_URL``, or the worker's configured
backend); ``teacher_model`` is the model name the harness asks for and is recorded on every task. The deployment,
with its cron schedule, is in the repository's ``prefect.yaml``.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from flows.dispatch import Dispatch, dispatch_rollouts
from polar.export import Acceptance, sft
from polar.rollout import dispatch_order, submit_tasks
from polar.rollout.context import get_store
from polar.rollout.dispatcher import new_dispatcher
from polar.settings import get_settings


@flow(name="polar-sft-generation", flow_run_name="sft-{name}", persist_result=False)
async def sft_generation(
    dataset: str,
    harness: dict[str, Any],
    name: str = "sft",
    samples_per_task: int = 1,
    evaluator: dict[str, Any] | None = None,
    teacher_model: str | None = None,
    acceptance: dict[str, Any] | None = None,
    output: str = "sft-exports",
    formats: list[str] | None = None,
    builder: str = "prefix_merge",
    dispatch: Dispatch = Dispatch.INLINE,
) -> dict[str, Any]:
    settings = get_settings()
    factory = await get_store(settings)
    rule = Acceptance.model_validate(acceptance or {})
    rows = await asyncio.to_thread(sft.load_dataset, dataset)
    done = await asyncio.to_thread(sft.accepted_keys, factory, name, rule)
    todo = [row for row in rows if row["id"] not in done]
    run_id = str(flow_run.get_id() or uuid.uuid4())
    summary: dict[str, Any] = {"dataset": name, "rows": len(rows), "skipped": len(rows) - len(todo), "tasks": 0}
    if not todo:
        return {**summary, "attempts": 0, "accepted": 0, "files": {}}
    requests = sft.task_requests(
        todo,
        dataset=name,
        harness=harness,
        samples=samples_per_task,
        evaluator=evaluator,
        teacher_model=teacher_model,
        builder=builder,
        run_id=run_id,
    )
    dispatcher = new_dispatcher("sft", run_id)  # owns the tasks it submits (polar.rollout.dispatcher)
    submitted = await asyncio.to_thread(submit_tasks, factory, requests, dispatcher=dispatcher)
    await dispatch_rollouts(
        dispatch_order(submitted), dispatch=Dispatch(dispatch), settings=settings, dispatcher=dispatcher
    )
    task_ids = [t.task_id for t in submitted]
    files = await asyncio.to_thread(
        sft.export_accepted, factory, settings, task_ids, rule, Path(output), name, formats or ["jsonl", "parquet"]
    )
    accepted = next(iter(files.values()))["rows"]
    return {
        **summary,
        "tasks": len(task_ids),
        "attempts": len(task_ids) * samples_per_task,
        "accepted": accepted,
        "files": files,
    }
