"""The batch flow: submit tasks, expand each into its samples, run all the rollouts concurrently.

    rollout_batch(tasks=[{...TaskRequest...}, ...], dispatch="inline" | "deployment")

It returns a summary (task ids, every rollout's final status and reward, the batch's alarms:
``flows.alarms``). Rollouts that failed a stage for good
are ERROR with their failure recorded; ``retry_failed`` resumes them. The batch itself ends Completed whatever
its rollouts' outcomes: an agent that failed its task is data, not a broken batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from prefect import flow
from prefect.runtime import flow_run
from sqlalchemy.orm import Session, sessionmaker

from db.enums import RolloutStatus
from db.models import Rollout
from flows.alarms import raise_batch_alarms
from flows.artifacts import publish_batch
from flows.dispatch import Dispatch, dispatch_rollouts, run_elsewhere
from polar.rollout import dispatch_order, submit_tasks
from polar.rollout.context import get_store
from polar.rollout.dispatcher import new_dispatcher
from polar.settings import get_settings


def summarize(factory: sessionmaker[Session], rollout_ids: list[str], flows: dict[str, str]) -> dict[str, Any]:
    """Final status, reward and error of each rollout, with how its flow run ended; counts by status; and
    ``not_run``: rollout id -> why, for those this run did not take to a final status (another runner or flow
    run held them, or they are still unfinished)."""
    with factory() as db:
        rows = db.execute(
            sa.select(Rollout.id, Rollout.status, Rollout.reward, Rollout.error).where(Rollout.id.in_(rollout_ids))
        ).all()
    rollouts = {
        row.id: {"status": row.status.value, "reward": row.reward, "error": row.error, "flow": flows.get(row.id)}
        for row in rows
    }
    counts: dict[str, int] = {}
    for item in rollouts.values():
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    not_run = {
        rollout_id: item["flow"] or "no outcome"
        for rollout_id, item in rollouts.items()
        if run_elsewhere(item["flow"] or "") or not RolloutStatus(item["status"]).is_terminal
    }
    return {"rollouts": rollouts, "counts": counts, "not_run": not_run}


@flow(name="polar-batch", flow_run_name="batch-{dispatch}", persist_result=False)
async def rollout_batch(tasks: list[dict[str, Any]], dispatch: Dispatch = Dispatch.INLINE) -> dict[str, Any]:
    """Submit ``tasks`` (TaskRequest dicts) and run every sample to its final status."""
    settings = get_settings()
    factory = await get_store(settings)
    # The batch owns what it submits (``polar.rollout.dispatcher``): a ``polar serve`` on the same store never
    # starts these tasks, and this batch starts no other runner's.
    dispatcher = new_dispatcher("batch", flow_run.get_id())
    submitted = await asyncio.to_thread(submit_tasks, factory, tasks, dispatcher=dispatcher)
    rollout_ids = dispatch_order(submitted)
    flows = await dispatch_rollouts(rollout_ids, dispatch=Dispatch(dispatch), settings=settings, dispatcher=dispatcher)
    summary = await asyncio.to_thread(summarize, factory, rollout_ids, flows)
    await publish_batch(factory, settings, rollout_ids)
    alarms = await raise_batch_alarms(factory, settings, rollout_ids)
    by_task = {t.task_id: list(t.rollout_ids) for t in submitted}
    return {"tasks": by_task, **summary, "alarms": [alarm.as_json() for alarm in alarms]}
