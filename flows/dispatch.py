"""How the batch and retry flows run many rollouts: in this process, or as deployment runs on the work pool.

``inline`` runs each rollout flow as a subflow of the caller, concurrently (at most ``POLAR_BATCH_MAX_ACTIVE``
in flight), sharing this process's stage limits: the embedded mode. ``deployment`` creates one flow run of the
rollout deployment (``POLAR_ROLLOUT_DEPLOYMENT``) per rollout, which whatever worker of the pool is free picks
up: the scale-out mode. Its idempotency key is the rollout and the calling flow run, so a retried batch flow
run does not create a second flow run for a rollout. Either way a rollout is claimed in its row before it
runs, so no rollout runs twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from prefect.deployments import arun_deployment
from prefect.runtime import flow_run

from flows.limits import ensure_limits
from flows.rollout import rollout
from polar.settings import LimitScope, Settings


class Dispatch(StrEnum):
    INLINE = "inline"
    DEPLOYMENT = "deployment"


async def dispatch_rollouts(
    rollout_ids: Sequence[str], *, dispatch: Dispatch, settings: Settings, takeover: bool = False
) -> dict[str, str]:
    """Run every rollout; returns rollout id -> how its flow run ended ("ok" or the error)."""
    if settings.stage_limits is LimitScope.PREFECT:
        await ensure_limits(settings)
    gate = asyncio.Semaphore(settings.batch_max_active)
    parent = flow_run.get_id() or "none"

    async def one(rollout_id: str) -> Any:
        async with gate:
            if dispatch is Dispatch.INLINE:
                return await rollout(rollout_id, takeover=takeover)
            run = await arun_deployment(
                settings.rollout_deployment,
                parameters={"rollout_id": rollout_id, "takeover": takeover},
                timeout=None,
                poll_interval=1,
                idempotency_key=f"polar-rollout-{rollout_id}-{parent}",
            )
            if run.state is None or not run.state.is_completed():
                raise RuntimeError(f"flow run {run.name} ended {run.state.name if run.state else 'without a state'}")
            return run

    results = await asyncio.gather(*(one(rollout_id) for rollout_id in rollout_ids), return_exceptions=True)
    return {
        rollout_id: "ok" if not isinstance(result, BaseException) else f"{result.__class__.__name__}: {result}"
        for rollout_id, result in zip(rollout_ids, results, strict=True)
    }


async def run_inline(rollout_ids: list[str], settings: Settings) -> None:
    """The control API's inline dispatch (``polar.api.runner.InlineDispatch``): the rollout flows in this process."""
    await dispatch_rollouts(rollout_ids, dispatch=Dispatch.INLINE, settings=settings)
