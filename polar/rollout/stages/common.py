"""What every stage shares: the begin/skip/finish bookkeeping around its body, and the rollout's runtimes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from db.stage_results import StageResult
from harness_adapters.base import HarnessContext
from polar.rollout import state
from polar.rollout.context import RolloutContext
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.runtime import open_runtime
from polar.runtime.base import Runtime

log = logging.getLogger(__name__)

StageBody = Callable[[RolloutContext, RolloutView, str], Awaitable[StageOutput]]


@dataclass(frozen=True)
class StageReport:
    """What a stage call did: ran (``skipped`` False) or found the stage already done; and its result."""

    rollout_id: str
    stage: Stage
    skipped: bool
    result: StageResult


async def _heartbeat(ctx: RolloutContext, rollout_id: str, owner: str) -> None:
    """Proves the owner alive while a stage runs, so the retry flow never takes over a working rollout."""
    while True:
        await asyncio.sleep(ctx.settings.heartbeat_s)
        await asyncio.to_thread(state.heartbeat, ctx.factory, rollout_id, owner)


async def run_stage(ctx: RolloutContext, rollout_id: str, stage: Stage, owner: str, body: StageBody) -> StageReport:
    """Begin ``stage`` in the row, run ``body`` unless the stage is already done, record its output.

    An exception from the body leaves the stage not done (its attempt is counted), so a retry runs it again.
    While the body runs, the rollout's heartbeat is refreshed every ``POLAR_HEARTBEAT_S``.
    """
    defaults = ctx.settings.rollout_timeout_s
    start = await asyncio.to_thread(
        state.begin_stage, ctx.factory, rollout_id, stage, owner, default_timeout_s=defaults
    )
    if start.skipped:
        log.info("rollout %s: %s already done, skipped", rollout_id, stage)
        done = start.view.results.stage(stage)
        assert done is not None, f"rollout {rollout_id}: {stage} is done but has no result"  # one transaction sets both
        return StageReport(rollout_id, stage, True, done)
    started = time.monotonic()
    beat = asyncio.create_task(_heartbeat(ctx, rollout_id, owner))
    try:
        output = await body(ctx, start.view, owner)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    await asyncio.to_thread(state.finish_stage, ctx.factory, rollout_id, stage, owner, output)
    log.info("rollout %s: %s done in %.2f s", rollout_id, stage, time.monotonic() - started)
    return StageReport(rollout_id, stage, False, output.result)


def agent_runtime(ctx: RolloutContext, view: RolloutView) -> Runtime:
    spec = view.task.runtime
    return open_runtime(
        spec.type or ctx.settings.runtime,
        ctx.settings,
        view.id,
        env=spec.env,
        isolation=spec.isolation,
        options=spec.options,
    )


def eval_runtime(ctx: RolloutContext, view: RolloutView) -> Runtime:
    spec = view.task.runtime
    return open_runtime(
        spec.type or ctx.settings.runtime,
        ctx.settings,
        f"{view.id}-eval",
        env=spec.env,
        isolation=spec.isolation,
        options=spec.options,
    )


def harness_context(ctx: RolloutContext, view: RolloutView, runtime: Runtime) -> HarnessContext:
    layout = runtime.layout
    return HarnessContext(
        instruction=view.task.instruction,
        instruction_file=str(layout.logs / "instruction.md"),
        workdir=str(layout.work),
        home=str(layout.home),
        logs_dir=str(layout.logs),
        model=view.task.harness.model,
        python=runtime.interpreter(ctx.python),
        tools_dir=str(ctx.settings.tools_dir),
        sample_index=view.sample_index,
    )


def harness_config(view: RolloutView) -> tuple[Any, Any]:
    from harness_adapters import get_adapter

    adapter = get_adapter(view.task.harness.name)
    return adapter, adapter.Config.model_validate(view.task.harness.config)
