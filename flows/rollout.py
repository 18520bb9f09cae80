"""The rollout flow: one flow run per rollout, its four stages as four task runs.

The tasks are thin: each calls a stage function of ``polar.rollout.stages``. The rollout row is the state that
counts, so every task sets ``cache_policy=NO_CACHE`` (a stage already done skips itself from the row, on any
worker, without shared result storage) and a stage found done ends its task run as ``Skipped``. Retries and
delays come from the settings per stage; Prefect's timeout is only a backstop, since the stages enforce the
deadline and budgets themselves (a thread-pool task's timeout cannot interrupt blocking code, and these are
async tasks anyway). ``drive_rollout`` takes the stage limits and, when a stage fails for good, marks the
rollout failed at that stage and keeps its partial work; the flow run then ends Failed.
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine, Mapping
from typing import Any

from prefect import Flow, State, Task, flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Completed

from flows.artifacts import publish_rollout
from flows.limits import make_limiter
from flows.owners import prefect_owner_probe
from polar.proxy.embedded import start_embedded
from polar.rollout import (
    STAGE_FUNCTIONS,
    RolloutView,
    Stage,
    drive_rollout,
    get_context,
)
from polar.rollout.stages import StageFunction
from polar.settings import Settings

# Prefect's backstop beyond the stage's own limits: generous, it only catches a stage that hangs.
BACKSTOP_S = 600.0


def _stage_task(stage: Stage, function: StageFunction) -> Task[..., Any]:
    async def body(rollout_id: str, owner: str) -> dict[str, Any] | State:
        ctx = await get_context(start_gateway=start_embedded)
        report = await function(ctx, rollout_id, owner=owner)
        if report.skipped:
            return Completed(message=f"{stage} was already done", name="Skipped")
        return report.result.as_json()

    body.__name__ = body.__qualname__ = f"{stage.value}_stage"
    return task(
        name=stage.value,
        task_run_name=f"{stage.value}-{{rollout_id}}",
        cache_policy=NO_CACHE,
        persist_result=False,
        retries=0,
        timeout_seconds=BACKSTOP_S,
    )(body)


def _options(stage: Stage, view: RolloutView, settings: Settings) -> dict[str, Any]:
    retries = {
        Stage.INIT: settings.init_retries,
        Stage.RUN: settings.run_retries,
        Stage.POSTRUN: settings.postrun_retries,
        Stage.EVALUATE: settings.evaluate_retries,
    }[stage]
    limit = {
        Stage.INIT: view.timeout_s,
        Stage.RUN: view.timeout_s,
        Stage.POSTRUN: settings.postrun_timeout_s,
        Stage.EVALUATE: view.task.evaluator.timeout_s,
    }[stage]
    return {
        "retries": retries,
        "retry_delay_seconds": settings.stage_retry_delay_s,
        "timeout_seconds": limit + BACKSTOP_S,
    }


RolloutFlow = Flow[..., Coroutine[Any, Any, dict[str, Any]]]


def build_rollout_flow(stage_functions: Mapping[Stage, StageFunction], *, name: str = "polar-rollout") -> RolloutFlow:
    """A rollout flow over ``stage_functions`` (benchmarks pass simulated stages; deployments use ``rollout``)."""
    stage_tasks = {stage: _stage_task(stage, stage_functions[stage]) for stage in Stage}

    async def rollout(rollout_id: str, takeover: bool = False, stale_after_s: float | None = None) -> dict[str, Any]:
        """Run one rollout to its final status (resuming it where an earlier attempt stopped). ``takeover`` with
        ``stale_after_s``: the retry flow's, how long the current owner must have been silent (None: the
        settings'); the owner's flow run must also not be running (``flows.owners``)."""
        ctx = await get_context(start_gateway=start_embedded)
        owner = str(flow_run.get_id() or f"local-{uuid.uuid4()}")

        async def call(stage: Stage, view: RolloutView) -> object:
            return await stage_tasks[stage].with_options(**_options(stage, view, ctx.settings))(rollout_id, owner)

        try:
            summary = await drive_rollout(
                ctx,
                rollout_id,
                owner,
                limiter=make_limiter(ctx.settings),
                call=call,
                takeover=takeover,
                stale_after_s=stale_after_s,
                owner_gone=prefect_owner_probe(ctx.settings, stale_after_s),
            )
        finally:  # a rollout that failed a stage gets its artifact too (its failure cause is the point)
            await publish_rollout(ctx.factory, ctx.settings, rollout_id)
        return {
            "rollout_id": summary.rollout_id,
            "status": summary.status.value,
            "reward": summary.reward,
            "error": summary.error,
            "resumed_after": list(summary.skipped),
        }

    return flow(name=name, flow_run_name="rollout-{rollout_id}", persist_result=False)(rollout)


rollout = build_rollout_flow(STAGE_FUNCTIONS)
