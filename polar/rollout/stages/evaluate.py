"""The ``evaluate`` stage: the rollout's reward, its final status, and its trajectories rewarded.

Only a COMPLETED run is evaluated; an ERROR or TIMEOUT run gets reward 0 without running the evaluator (its
trajectories are masked, or kept as negatives after an agent-budget timeout, by the training filter). The
evaluator runs in the agent's runtime, or with ``fresh_runtime`` in the evaluation runtime (prepared during
the run, the agent's diff applied). An ``EvaluationError`` (or a timeout) fails the stage, so Prefect retries
it, and the retry flow later resumes only this stage: earlier stages are done and are never run again. On
success the evaluation is stored (replacing an earlier one of the same evaluator), the trajectories are rebuilt
with the reward, and the runtimes are removed unless ``POLAR_KEEP_WORKDIRS`` is set.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sqlalchemy as sa

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Evaluation
from polar.errors import EvaluationError
from polar.evaluators import get_evaluator
from polar.evaluators.base import EvalContext
from polar.rollout.context import RolloutContext
from polar.rollout.stages.common import (
    StageReport,
    agent_runtime,
    eval_runtime,
    run_stage,
)
from polar.rollout.stages.fresh import fresh_eval_runtime, rebuild_agent_runtime
from polar.rollout.stages.postrun import build_trajectories
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.trajectory import TrajectoriesConsumed

# How long past the evaluator's own timeout the stage waits for it (its commands time out by themselves).
GRACE_S = 10.0


def _store_evaluation(
    ctx: RolloutContext, rollout_id: str, evaluator: str, reward: float, details: dict[str, Any], duration_s: float
) -> None:
    with session_scope(ctx.factory) as db:
        db.execute(sa.delete(Evaluation).where(Evaluation.rollout_id == rollout_id, Evaluation.evaluator == evaluator))
        db.add(
            Evaluation(
                rollout_id=rollout_id, evaluator=evaluator, reward=reward, details=details, duration_s=duration_s
            )
        )


async def _score(ctx: RolloutContext, view: RolloutView) -> tuple[float, dict[str, Any]]:
    spec = view.task.evaluator
    evaluator = get_evaluator(spec.type)
    config = evaluator.Config.model_validate(spec.config)
    postrun = view.results.postrun
    artifacts = dict(postrun.artifacts) if postrun is not None else {}
    report: dict[str, Any] = {"evaluator": spec.type}
    if spec.fresh_runtime:
        runtime, report["fresh_runtime"] = await fresh_eval_runtime(ctx, view, artifacts)
    else:
        runtime = agent_runtime(ctx, view)
        if runtime.exists():
            await runtime.start(fresh=False)
        else:  # resumed on another host: the agent's runtime rebuilt from the kept artifacts
            report["rebuilt_runtime"] = await rebuild_agent_runtime(ctx, view, artifacts)
    eval_ctx = EvalContext(
        rollout_id=view.id,
        instruction=view.task.instruction,
        runtime=runtime,
        timeout_s=spec.timeout_s,
        python=runtime.interpreter(ctx.python),
        artifacts=artifacts,
        chat=ctx.chat,
    )
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(evaluator.evaluate(config, eval_ctx), spec.timeout_s + GRACE_S)
    except TimeoutError:
        raise EvaluationError(f"evaluator {spec.type} did not finish within {spec.timeout_s:g} s") from None
    duration = time.monotonic() - started
    details = dict(result.details)
    await asyncio.to_thread(_store_evaluation, ctx, view.id, spec.type, result.reward, details, duration)
    report.update(reward=result.reward, duration_s=round(duration, 3), details=details)
    return result.reward, report


async def _evaluate(ctx: RolloutContext, view: RolloutView, owner: str) -> StageOutput:
    run = view.run
    outcome = RolloutStatus(run.outcome)
    if outcome is RolloutStatus.COMPLETED:
        reward, report = await _score(ctx, view)
    else:
        reward, report = 0.0, {"evaluator": None, "skipped": f"the run ended {outcome.value}; reward 0", "reward": 0.0}
    try:
        report["build"] = await asyncio.to_thread(
            build_trajectories,
            ctx,
            view.id,
            builder=view.task.builder,
            status=outcome.value,
            aligned_agent_timeout=run.agent_budget_expired,
            reward=reward,
        )
    except TrajectoriesConsumed as exc:  # a trainer took the rows already; they are not handed out twice
        report["build"] = {"kept": exc.message}
    if not ctx.settings.keep_workdirs:
        for runtime in (agent_runtime(ctx, view), eval_runtime(ctx, view)):
            await runtime.stop(remove=True)
    return StageOutput(report, status=outcome, reward=reward, error=run.error)


async def evaluate(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport:
    return await run_stage(ctx, rollout_id, Stage.EVALUATE, owner, _evaluate)
