"""The ``run`` stage: launch the harness against its gateway session and record how it ended.

The session is opened here, with a new key (see ``gateway_client``), and the adapter's launch spec points the
harness at it, through ``runtime.reach`` (a runtime without the host's network gets a tunnel to the gateway).
The harness gets ``min(agent budget, time left before the shared deadline)``; the agent budget
starts now, so time spent initialising or waiting for a run slot is not the agent's. The outcome, never an
exception, says how the harness ended:

- COMPLETED: it exited 0.
- ERROR: it exited non-zero (crashed): its captures are kept, its trajectories will be masked.
- TIMEOUT: it was killed at its limit. ``agent_budget_expired`` (the agent's own budget ran out) makes its
  trajectories trainable reward-0 negatives; a deadline expiry is masked.

Two ends say nothing about the policy, so they are infrastructure errors (``RunResult.infra_error``): the stage
raises ``HarnessError`` after recording the end (a retry raises it again), the rollout is ERROR with the cause,
its captures are masked and the batch's circuit breaker counts it. The harness could not start (exit 126 or 127,
the shell's statuses for a command that is not executable or not found: a CLI missing from the tools folder, an
image without the interpreter); or an agent (``ModelCalls.REQUIRED``) exited 0 with no model call reaching its
session. A harness that never calls the model (``ModelCalls.NONE``: a task's oracle or no-op) gets no relay to
the gateway.

The launch is recorded in the row before the harness starts, and how it ended as soon as it has; a retried run
that finds the end reports it. The harness runs under the launcher (``polar.runtime.launcher``), which writes its
exit status and end time into the runtime folder: a resumed run that finds a launch but no end in the row (its
flow run died) reads that file, and a harness that had finished is reported as it ended (``recovered``), so the
rollout goes on to postrun and its real reward. Without the file (the harness was still running when its worker
died) it launches the harness again with a fresh session and a freshly prepared runtime, after setting the cut-
short launch and its captures aside (``relaunch``: they are kept, marked ``INTERRUPTED``, never trained); the
report's ``relaunched`` says so and why. At most ``POLAR_RUN_RETRIES`` relaunches per rollout; past that the run
records ERROR (``interrupted``). The session is closed as soon as the harness is gone, so nothing reaches it
afterwards.

With ``evaluator.fresh_runtime`` the evaluation runtime is prepared while the agent runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from dataclasses import dataclass

from db.enums import RolloutStatus
from db.stage_reports import ArtifactSummary, RuntimeReport
from db.stage_results import LaunchedProcess, Relaunch, RunProgress, RunResult
from harness_adapters.base import ModelCalls
from polar.errors import HarnessError
from polar.rollout import state
from polar.rollout.artifacts import keep_artifacts
from polar.rollout.context import RolloutContext
from polar.rollout.stages.common import (
    StageReport,
    agent_runtime,
    harness_config,
    harness_context,
    run_stage,
)
from polar.rollout.stages.fresh import prepare_eval_runtime
from polar.rollout.stages.relaunch import after_interruption
from polar.rollout.state import RolloutView, Stage, StageOutput
from polar.runtime.base import ProcessHandle, Runtime
from polar.runtime.launcher import clear_exit, exit_path, launcher_argv, read_exit

OUTPUT_EXCERPT = 2000


@dataclass(frozen=True)
class _End:
    """How the harness ended: the outcome fields of the run's report."""

    outcome: RolloutStatus
    agent_budget_expired: bool = False
    deadline_expired: bool = False
    error: str | None = None

    def recorded_in(self, report: RunResult) -> RunResult:
        """``report`` with this end's error, when there is one (a clean exit's report has no ``error`` key)."""
        return report if self.error is None else report.model_copy(update={"error": self.error})


def _ended(returncode: int | None, timed_out: bool, by_agent: bool, budget: float, stderr: str) -> _End:
    if timed_out:
        limit = "agent budget" if by_agent else "deadline"
        error = f"the harness ran past its {limit} ({budget:.1f} s) and was stopped"
        return _End(RolloutStatus.TIMEOUT, agent_budget_expired=by_agent, deadline_expired=not by_agent, error=error)
    if returncode != 0:
        return _End(RolloutStatus.ERROR, error=f"the harness exited with code {returncode}: {stderr[-300:].strip()}")
    return _End(RolloutStatus.COMPLETED)


# The shell's statuses for a command it could not run (POSIX): the harness never started.
_CANNOT_START = {126: "is not executable", 127: "was not found"}


async def _infra_error(ctx: RolloutContext, view: RolloutView, report: RunResult) -> str | None:
    """Why this end says nothing about the policy (see the module's docstring), None when it is an outcome."""
    said = report.stderr_tail[-300:].strip()
    if report.exit_code in _CANNOT_START:
        cause = f"the harness could not start: its command {_CANNOT_START[report.exit_code]} in the runtime"
        return f"{cause} (exit {report.exit_code})" + (f": {said}" if said else "")
    adapter, config = harness_config(view)
    if report.exit_code == 0 and adapter.model_calls(config) is ModelCalls.REQUIRED:
        if await asyncio.to_thread(state.calls_since_set_aside, ctx.factory, view.id) == 0:
            return "the harness exited 0 without a model call" + (f": {said}" if said else "")
    return None


async def _record_end(ctx: RolloutContext, view: RolloutView, owner: str, ended: RunResult) -> RunResult:
    """Recorded before anything else can fail: a retry of the stage then reports the harness as it ended.
    Returns ``ended`` with its ``infra_error`` set, where it has one."""
    infra = await _infra_error(ctx, view, ended)
    if infra is not None:
        ended = ended.model_copy(update={"infra_error": infra, "error": infra, "outcome": RolloutStatus.ERROR})
    await asyncio.to_thread(state.record_progress, ctx.factory, view.id, owner, RunProgress(ended=ended))
    return ended


def _outcome(report: RunResult) -> StageOutput:
    """The stage's output for a recorded end; an infrastructure error is raised instead."""
    if report.infra_error is not None:
        raise HarnessError(report.infra_error)
    return StageOutput(report)


async def _recovered(
    ctx: RolloutContext, view: RolloutView, runtime: Runtime, launch: RunProgress
) -> StageOutput | None:
    """The report of a harness that finished before its worker died (its launcher's exit file), if it did.

    Only an end before this attempt began counts: a harness that went on (its worker was stale, not dead, so its
    container kept running) ran without its session, which the takeover revoked, so its end says nothing about
    the task."""
    ended = await read_exit(runtime, launch.launch_id) if launch.launch_id else None
    if ended is None:
        return None
    this_attempt = view.timings.started_at(Stage.RUN)
    if this_attempt is not None and ended.ended_at > this_attempt:
        return None
    launched_at = launch.launched
    assert launched_at is not None  # the caller saw the launch recorded
    budget = launch.budget_s or 0.0
    stderr = _log_tail(runtime, "harness.stderr")
    end = _ended(ended.exit_code, False, False, budget, stderr)
    report = end.recorded_in(
        RunResult(
            launched=True,
            recovered=True,
            exit_code=ended.exit_code,
            duration_s=round(max(0.0, (ended.ended_at - launched_at).total_seconds()), 3),
            budget_s=round(budget, 3),
            agent_budget_expired=end.agent_budget_expired,
            deadline_expired=end.deadline_expired,
            stdout_tail=_log_tail(runtime, "harness.stdout"),
            stderr_tail=stderr,
            outcome=end.outcome,
        )
    )
    report = await _record_end(ctx, view, view.owner or "", report)
    await ctx.gateway.close_session(view.id)
    return _outcome(report.model_copy(update={"artifacts": await _keep(ctx, view, runtime)}))


async def _keep(ctx: RolloutContext, view: RolloutView, runtime: Runtime) -> ArtifactSummary:
    """The artifacts a later stage needs on any host, kept while this host still has the runtime folder."""
    try:
        return await asyncio.wait_for(
            keep_artifacts(ctx.factory, ctx.settings, view, runtime), ctx.settings.postrun_timeout_s
        )
    except Exception as exc:  # noqa: BLE001 - postrun keeps them again if it runs here; elsewhere it fails naming them
        return ArtifactSummary(error=f"keeping the artifacts failed: {exc.__class__.__name__}: {exc}")


def _log_tail(runtime: Runtime, name: str) -> str:
    try:
        with (runtime.layout.logs / name).open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - OUTPUT_EXCERPT))
            return f.read().decode("utf-8", errors="replace")[-OUTPUT_EXCERPT:]
    except OSError:
        return ""


async def _prewarm(ctx: RolloutContext, view: RolloutView) -> RuntimeReport:
    try:
        return await prepare_eval_runtime(ctx, view)
    except Exception as exc:  # noqa: BLE001 - evaluate prepares it again; the run's outcome must not depend on it
        return RuntimeReport(error=f"{exc.__class__.__name__}: {exc}")


async def _resume(
    ctx: RolloutContext, view: RolloutView, runtime: Runtime, owner: str
) -> StageOutput | Relaunch | None:
    """What an earlier attempt of the run left: the harness's end (reported as it was), or a launch with no end,
    recovered from its exit file or set aside (``Relaunch``; the ERROR outcome past the relaunch limit). None
    when it launched nothing."""
    progress = view.results.run_progress
    if progress.ended is not None:  # the harness ended, then the stage failed (closing the session, say)
        await ctx.gateway.close_session(view.id)
        return _outcome(progress.ended)
    if not progress.launched_at:
        return None
    recovered = await _recovered(ctx, view, runtime, progress)
    if recovered is not None:
        return recovered
    return await after_interruption(ctx, view, runtime, progress, owner)


def _too_late(relaunched: Relaunch | None) -> StageOutput:
    timed_out = RunResult(
        outcome=RolloutStatus.TIMEOUT,
        launched=False,
        deadline_expired=True,
        agent_budget_expired=False,
        error="the deadline passed before the harness could start",
    )
    return StageOutput(timed_out if relaunched is None else timed_out.model_copy(update={"relaunched": relaunched}))


def _budget(view: RolloutView) -> tuple[float, bool]:
    """The harness's time limit, and whether it is the agent's own budget (not the time left to the deadline)."""
    remaining = view.remaining_s()
    agent_budget = view.task.agent_timeout_s
    if agent_budget is not None and agent_budget <= remaining:
        return agent_budget, True
    return remaining, False


async def _run(ctx: RolloutContext, view: RolloutView, owner: str) -> StageOutput:
    runtime = agent_runtime(ctx, view)
    relaunched = await _resume(ctx, view, runtime, owner)
    if isinstance(relaunched, StageOutput):
        return relaunched
    init = view.results.init
    expired = (init is not None and init.deadline_expired) or (relaunched is not None and relaunched.deadline_expired)
    if expired or view.remaining_s() <= 0:
        return _too_late(relaunched)
    await runtime.start(fresh=False)
    adapter, config = harness_config(view)
    hctx = harness_context(ctx, view, runtime)
    access = await ctx.gateway.open_session(view.id, policy=view.policy)
    # A harness that never calls the model needs no way to the gateway (nor what the relay needs: Node).
    needs_gateway = adapter.model_calls(config) is not ModelCalls.NONE
    async with runtime.reach(ctx.gateway.url) if needs_gateway else contextlib.nullcontext(ctx.gateway.url) as url:
        # Inside a runtime without the host's network the gateway has another address (a tunnel's).
        launch = adapter.launch(config, hctx, access.rebased(ctx.gateway.url, url))
        for path, content in launch.files.items():
            await runtime.write_file(path, content)
        budget, by_agent = _budget(view)
        launch_id = uuid.uuid4().hex
        launched = RunProgress(
            launched_at=state.now().isoformat(), budget_s=budget, launch_id=launch_id, host=socket.gethostname()
        )
        clear_exit(runtime)
        await asyncio.to_thread(state.record_progress, ctx.factory, view.id, owner, launched)

        async def spawned(process: ProcessHandle) -> None:
            running = RunProgress(process=LaunchedProcess(pid=process.pid, start_ticks=process.start_ticks))
            await asyncio.to_thread(state.record_progress, ctx.factory, view.id, owner, running)

        prewarm = asyncio.create_task(_prewarm(ctx, view)) if view.task.evaluator.fresh_runtime else None
        try:
            result = await runtime.exec(
                launcher_argv(launch.argv, exit_path(runtime), launch_id),
                env=launch.env,
                timeout_s=budget,
                stdout_path=runtime.layout.logs / "harness.stdout",
                stderr_path=runtime.layout.logs / "harness.stderr",
                on_spawn=spawned,
            )
        except BaseException:
            if prewarm is not None:
                prewarm.cancel()
            raise

    end = _ended(result.returncode, result.timed_out, by_agent, budget, result.stderr)
    report = end.recorded_in(
        RunResult(
            launched=True,
            exit_code=result.returncode,
            duration_s=round(result.duration_s, 3),
            budget_s=round(budget, 3),
            agent_budget_expired=end.agent_budget_expired,
            deadline_expired=end.deadline_expired,
            stdout_tail=result.stdout[-OUTPUT_EXCERPT:],
            stderr_tail=result.stderr[-OUTPUT_EXCERPT:],
            outcome=end.outcome,
        )
    )
    if relaunched is not None:  # which launch was set aside, why, and its captures
        report = report.model_copy(update={"relaunched": relaunched})
    report = await _record_end(ctx, view, owner, report)
    await ctx.gateway.close_session(view.id)
    report = report.model_copy(update={"artifacts": await _keep(ctx, view, runtime)})
    if prewarm is not None:
        report = report.model_copy(update={"eval_runtime": await prewarm})
    return _outcome(report)


async def run(ctx: RolloutContext, rollout_id: str, *, owner: str) -> StageReport:
    return await run_stage(ctx, rollout_id, Stage.RUN, owner, _run)
