"""The ``postrun`` stage: keep what the rollout produced, whatever its outcome.

It uses the artifacts the run kept (the git diff of the working folder, the evaluator's files, the harness's logs:
``polar.rollout.artifact_store``), keeping them now if the run could not and this host has the runtime folder; a
COMPLETED run whose folder is elsewhere and whose artifacts were not kept fails here, naming them. It makes sure
the gateway session is closed, and builds the rollout's trajectories from its captures with the task's builder.
Trajectories are built for every outcome: an ERROR or TIMEOUT rollout keeps its captures and gets trajectories
under the fail-closed training filter (``build_and_store`` with the run's outcome and whether the agent budget
expired). Rewards are assigned when evaluate rebuilds them. The rollout's weight-version range is set from its
first and last captures.
"""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from db.engine import session_scope
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout
from db.stage_reports import ArtifactSummary, BuildSummary
from db.stage_results import PostrunResult
from polar.errors import ArtifactMissing
from polar.rollout.artifacts import keep_artifacts
from polar.rollout.context import RolloutContext
from polar.rollout.stages.common import StageReport, agent_runtime, run_stage
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.trajectory import build_and_store


def build_trajectories(
    ctx: RolloutContext,
    rollout_id: str,
    *,
    builder: str,
    status: RolloutStatus,
    aligned_agent_timeout: bool,
    reward: float | None = None,
) -> BuildSummary:
    """Build and store ``rollout_id``'s trajectories; returns a summary for the stage result."""
    with session_scope(ctx.factory) as db:
        built = build_and_store(
            db,
            rollout_id,
            builder=builder,
            outcome_reward=reward,
            status=status,
            aligned_agent_timeout=aligned_agent_timeout,
        )
        versions = (
            db.execute(
                sa.select(Capture.weight_version)
                .where(
                    Capture.rollout_id == rollout_id,
                    Capture.status == CaptureStatus.OK,
                    Capture.weight_version.is_not(None),
                )
                .order_by(Capture.seq)
            )
            .scalars()
            .all()
        )
        if versions:
            row = db.get(Rollout, rollout_id)
            assert row is not None
            row.weight_version_min, row.weight_version_max = versions[0], versions[-1]
    stats = built.stats
    return BuildSummary(
        builder=builder,
        captures=stats.captures_in,
        error_captures=stats.error_captures,
        trajectories=stats.traces_out,
        loss_tokens=sum(t.n_loss_tokens for t in built.traces),
        filter=sorted({t.filter_reason for t in built.traces if t.filter_reason}),
    )


async def _postrun(ctx: RolloutContext, view: RolloutView, owner: str) -> StageOutput:
    run = view.run
    runtime = agent_runtime(ctx, view)
    artifacts = run.artifacts
    if not artifacts.kept:
        if runtime.exists():
            artifacts = await asyncio.wait_for(
                keep_artifacts(ctx.factory, ctx.settings, view, runtime), ctx.settings.postrun_timeout_s
            )
        elif run.outcome is RolloutStatus.COMPLETED:
            # Its evaluator needs the agent's changes: without them it would grade untouched files (a silent 0).
            raise ArtifactMissing(
                f"rollout {view.id}: the runtime folder {runtime.layout.root} is not on this host and the run kept "
                f"no artifacts (diff.patch, the evaluator's files): {artifacts.error or 'none recorded'}",
                field="artifacts",
            )
        else:  # an ERROR or TIMEOUT run is rewarded 0 by its outcome; nothing will read its changes
            artifacts = ArtifactSummary(error=f"the runtime folder {runtime.layout.root} is gone; no artifacts")
    await ctx.gateway.close_session(view.id)
    built = await asyncio.to_thread(
        build_trajectories,
        ctx,
        view.id,
        builder=view.task.builder,
        status=run.outcome,
        aligned_agent_timeout=run.agent_budget_expired,
    )
    return StageOutput(PostrunResult(artifacts=artifacts, build=built))


async def postrun(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport:
    return await run_stage(ctx, rollout_id, Stage.POSTRUN, owner, _postrun)
