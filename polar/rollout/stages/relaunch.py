"""A harness launch cut short (its flow run died while the harness ran): set it aside and launch again.

The run stage calls ``after_interruption`` when its progress shows a launch with no end and the launcher's exit
file shows none either (the harness was still running when its worker died). Then:

1. any leftover process of that launch is killed (a frozen worker's container may still run it);
2. the session is closed, so no call of the old launch can commit from now on (the capture writer commits only
   while the session is open under the key the call was authenticated with);
3. the launch and its captures are set aside (``state.set_aside``): the captures become ``INTERRUPTED``, never
   trained, never merged into the new launch's trajectories, and the gateway's history skips them; the run
   stage opens a fresh session (a new key, which every gateway replica sees as a new history) and launches again;
4. the runtime is prepared again (fresh, the task's prepare actions, the harness's files), unless init already
   prepared it after that launch (the runtime was gone on this host), so the new launch starts where the first
   one did, not from what the killed harness left.

The relaunches are bounded by ``POLAR_RUN_RETRIES`` (per rollout, over every flow run): past it the run ends
ERROR (``interrupted``) with the captures kept as they were, masked, as a run that fails for good does.
"""

from __future__ import annotations

import asyncio

from db.enums import RolloutStatus
from db.stage_results import Relaunch, RunProgress, RunResult
from polar.rollout import state
from polar.rollout.context import RolloutContext
from polar.rollout.stages.init import prepare_agent_runtime
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.runtime.base import ProcessHandle, Runtime

REASON = "the flow run that launched the harness died before the harness ended"


def _prepared_since(view: RolloutView, launch: RunProgress) -> bool:
    """Whether init prepared the runtime after that launch (init ran again: the runtime was not on this host)."""
    prepared, launched = view.timings.started_at(Stage.INIT), launch.launched
    return prepared is not None and launched is not None and prepared > launched


async def after_interruption(
    ctx: RolloutContext, view: RolloutView, runtime: Runtime, launch: RunProgress, owner: str
) -> StageOutput | Relaunch:
    """Set the cut-short ``launch`` aside; returns what the new launch's report records (``relaunched``), or the
    run's ERROR outcome when no relaunch is left."""
    killed = False
    process = launch.process
    if process is not None and runtime.exists():
        killed = await runtime.kill(ProcessHandle(process.pid, process.start_ticks))
    await ctx.gateway.close_session(view.id)
    earlier = view.results.interrupted_runs
    allowed = ctx.settings.run_retries
    if len(earlier) >= allowed:
        return StageOutput(
            RunResult(
                outcome=RolloutStatus.ERROR,
                interrupted=True,
                leftover_killed=killed,
                agent_budget_expired=False,
                relaunches=len(earlier),
                error=(
                    f"the harness run was interrupted ({REASON}); it was launched again {len(earlier)} time(s), "
                    f"as many as POLAR_RUN_RETRIES ({allowed}) allows"
                ),
            )
        )
    record = await asyncio.to_thread(state.set_aside, ctx.factory, view.id, owner, launch, REASON)
    prepare_again = not _prepared_since(view, launch)
    expired = prepare_again and (await prepare_agent_runtime(ctx, view, runtime)).deadline_expired
    return Relaunch.model_validate(
        {
            **record.as_json(),
            "leftover_killed": killed,
            "runtime_prepared_again": prepare_again,
            **({"deadline_expired": True} if expired else {}),  # the key is there only when it is true
        }
    )
