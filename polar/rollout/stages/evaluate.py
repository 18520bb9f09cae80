"""The ``evaluate`` stage: the rollout's reward, its final status, and its trajectories rewarded.

A COMPLETED run is evaluated, and so is a run stopped because the agent's own budget ran out: as Harbor does,
the verifier scores the state the agent left and the reward stands, the rollout's status (TIMEOUT) recording the
timeout beside it (the training filter keeps such trajectories trainable with that reward). An ERROR run, or a
TIMEOUT at the rollout's deadline, gets reward 0 without running the evaluator (its trajectories are masked). The
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
from db.stage_reports import ArtifactSummary, BuildSummary
from db.stage_results import EvaluateResult
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


async def _score(ctx: RolloutContext, view: RolloutView) -> tuple[float, EvaluateResult]:
    spec = view.task.evaluator
    evaluator = get_evaluator(spec.type)
    config = evaluator.Config.model_validate(spec.config)
    postrun = view.results.postrun
    artifacts = postrun.artifacts if postrun is not None else ArtifactSummary()
    fresh = rebuilt = None
    if spec.fresh_runtime:
        runtime, fresh = await fresh_eval_runtime(ctx, view, artifacts)
    else:
        runtime = agent_runtime(ctx, view)
        if runtime.exists():
            await runtime.start(fresh=False)
        else:  # resumed on another host: the agent's runtime rebuilt from the kept artifacts
            rebuilt = await rebuild_agent_runtime(ctx, view, artifacts)
    network = spec.network or ctx.settings.verify_network
    if network != "same":  # a verifier that fetches its tools, or one kept offline whatever the agent had
        await runtime.use_network(network)
    eval_ctx = EvalContext(
        rollout_id=view.id,
        instruction=view.task.instruction,
        runtime=runtime,
        timeout_s=spec.timeout_s,
        python=runtime.interpreter(ctx.python),
        artifacts=artifacts.as_json(),  # evaluators read the summary as stored (``diff``, ...)
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
    scored = EvaluateResult(evaluator=spec.type, reward=result.reward, duration_s=round(duration, 3), details=details)
    if fresh is not None:
        scored = scored.model_copy(update={"fresh_runtime": fresh})
    elif rebuilt is not None:
        scored = scored.model_copy(update={"rebuilt_runtime": rebuilt})
    return result.reward, scored


async def _evaluate(ctx: RolloutContext, view: RolloutView, owner: str) -> StageOutput:
    run = view.run
    outcome = run.outcome
    if outcome is RolloutStatus.COMPLETED or (outcome is RolloutStatus.TIMEOUT and run.agent_budget_expired):
        reward, report = await _score(ctx, view)
    else:
        reward = 0.0
        report = EvaluateResult(evaluator=None, skipped=f"the run ended {outcome.value}; reward 0", reward=reward)
    try:
        built = await asyncio.to_thread(
            build_trajectories,
            ctx,
            view.id,
            builder=view.task.builder,
            status=outcome,
            aligned_agent_timeout=run.agent_budget_expired,
            reward=reward,
        )
    except TrajectoriesConsumed as exc:  # a trainer took the rows already; they are not handed out twice
        built = BuildSummary(kept=exc.message)
    if not ctx.settings.keep_workdirs:
        for runtime in (agent_runtime(ctx, view), eval_runtime(ctx, view)):
            await runtime.stop(remove=True)
    return StageOutput(report.model_copy(update={"build": built}), status=outcome, reward=reward, error=run.error)


async def evaluate(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport:
    return await run_stage(ctx, rollout_id, Stage.EVALUATE, owner, _evaluate)
