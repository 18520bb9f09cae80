"""The ``init`` stage: start the rollout's runtime, run its prepare actions, configure the harness.

The runtime always starts fresh (a retried init wipes what a failed attempt left). Prepare actions retry on
their own (``polar.rollout.prepare``). The harness gets its instruction file and the adapter's static files;
nothing secret is written here, since the gateway session is only opened when the run starts. If the shared
deadline passes while preparing, init still finishes (``deadline_expired``) and the run stage records the
rollout as TIMEOUT without launching anything.
"""

from __future__ import annotations

from db.stage_results import InitResult
from polar.rollout.context import RolloutContext
from polar.rollout.prepare import DeadlinePassed, run_prepare
from polar.rollout.stages.common import (
    StageReport,
    agent_runtime,
    harness_config,
    harness_context,
    run_stage,
)
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.runtime.base import Runtime


async def prepare_agent_runtime(ctx: RolloutContext, view: RolloutView, runtime: Runtime) -> InitResult:
    """Start ``runtime`` fresh and prepare it for the harness; the init stage's result (also what the run stage
    does when it prepares the runtime again before launching a harness a second time)."""
    await runtime.start(fresh=True)
    described, harness = runtime.describe(), view.task.harness.name
    try:
        prepared = await run_prepare(
            runtime,
            view.task.runtime.prepare,
            copy_roots=ctx.settings.copy_root_paths,
            remaining_s=view.remaining_s,
        )
    except DeadlinePassed as exc:
        return InitResult(runtime=described, harness=harness, deadline_expired=True, error=str(exc))
    adapter, config = harness_config(view)
    hctx = harness_context(ctx, view, runtime)
    await runtime.write_file(hctx.instruction_file, view.task.instruction)
    files = dict(adapter.setup_files(config, hctx))
    for path, content in files.items():
        await runtime.write_file(path, content)
    return InitResult(runtime=described, harness=harness, prepare=prepared, harness_files=sorted(files))


async def _init(ctx: RolloutContext, view: RolloutView, owner: str) -> StageOutput:
    return StageOutput(await prepare_agent_runtime(ctx, view, agent_runtime(ctx, view)))


async def init(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport:
    return await run_stage(ctx, rollout_id, Stage.INIT, owner, _init)
