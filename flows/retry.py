"""The retry flow: resume rollouts whose pipeline failed, and take over ones whose flow run died.

It selects rollouts marked failed at a stage (by id, by task, or all) and, with ``include_stale``, unfinished
ones whose owner has not sent a heartbeat for ``POLAR_STALE_AFTER_S`` (a killed worker, a batch that died
before dispatching them), then runs each one's rollout flow with ``takeover``: the rollout resumes at the stage
that failed, finished stages are skipped, and a harness that was cut short mid-run is launched again (at most
``POLAR_RUN_RETRIES`` times; its first launch's captures are set aside, see ``polar.rollout.stages.relaunch``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow

from flows.batch import summarize
from flows.dispatch import Dispatch, dispatch_rollouts
from polar.rollout.context import get_store
from polar.rollout.state import select_retryable
from polar.settings import get_settings


@flow(name="polar-retry-failed", flow_run_name="retry-failed", persist_result=False)
async def retry_failed(
    rollout_ids: list[str] | None = None,
    task_id: str | None = None,
    include_stale: bool = True,
    stale_after_s: float | None = None,
    dispatch: Dispatch = Dispatch.INLINE,
) -> dict[str, Any]:
    settings = get_settings()
    factory = await get_store(settings)
    stale = (stale_after_s if stale_after_s is not None else settings.stale_after_s) if include_stale else None
    chosen = await asyncio.to_thread(
        select_retryable, factory, rollout_ids=rollout_ids, task_id=task_id, stale_after_s=stale
    )
    flows = await dispatch_rollouts(
        chosen, dispatch=Dispatch(dispatch), settings=settings, dispatcher=None, takeover=True, stale_after_s=stale
    )
    return {"retried": chosen, **(await asyncio.to_thread(summarize, factory, chosen, flows))}
