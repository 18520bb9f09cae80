"""Drive one rollout through init → run → postrun → evaluate, under the stage limits and the READY buffer.

``drive_rollout`` is the whole lifecycle without Prefect: claim the rollout, take the slots each stage needs
(see ``limits``), call the stages in order, and when a stage fails for good (after whatever retries ``call``
applies) mark the rollout failed at that stage, keep what it produced (captures become masked ERROR
trajectories) and re-raise. Stages already done are called too: they skip themselves, and take no slot. The
Prefect flow passes a ``call`` that runs each stage as a Prefect task; tests and benchmarks call the stage
functions directly.

A resumed rollout whose init is done but whose runtime is not on this machine (the retry ran on another
worker) initialises again before its run; a harness launch it had recorded is kept for the run stage, which
launches the harness again (``stages.run``).

From its claim to its end the driver refreshes the rollout's heartbeat every ``POLAR_HEARTBEAT_S``, also while
it waits for a slot, so a silent heartbeat means a dead owner, never a busy fleet. Taking over another owner's
rollout needs that silence and ``owner_gone`` (``state.claim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from db.enums import RolloutStatus
from polar.errors import PolarError, RolloutClaimed
from polar.rollout import state
from polar.rollout.context import RolloutContext
from polar.rollout.limits import Limiter
from polar.rollout.stages import STAGE_FUNCTIONS
from polar.rollout.stages.common import agent_runtime, eval_runtime
from polar.rollout.stages.postrun import build_trajectories
from polar.rollout.state import RolloutView, Stage
from polar.rollout.state.ownership import OwnerProbe

log = logging.getLogger(__name__)

StageCall = Callable[[Stage, RolloutView], Awaitable[object]]
"""Runs one stage of the rollout (the view is the one at claim time, e.g. for timeouts)."""


@dataclass(frozen=True)
class RolloutSummary:
    rollout_id: str
    status: RolloutStatus
    reward: float | None
    error: str | None
    skipped: tuple[str, ...]  # stages found done when this drive started


def direct_call(ctx: RolloutContext, rollout_id: str, owner: str) -> StageCall:
    async def call(stage: Stage, view: RolloutView) -> object:
        return await STAGE_FUNCTIONS[stage](ctx, rollout_id, owner=owner)

    return call


def _slot(limiter: Limiter, name: str, needed: bool) -> AbstractAsyncContextManager[None]:
    return limiter.slot(name) if needed else contextlib.nullcontext()


class _HeldSlot:
    """A slot held by an asyncio task of its own, so it can be given back while other slots are held.

    The READY slot is taken before init and given back once the run slot is taken, which is not the nesting
    order of ``async with``; limiters built on cancel scopes (Prefect's) require each slot to be released by the
    task that took it, innermost first. A task of its own satisfies that.
    """

    def __init__(self, limiter: Limiter, name: str):
        self._limiter, self._name = limiter, name
        self._acquired, self._release = asyncio.Event(), asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    async def _hold(self) -> None:
        async with self._limiter.slot(self._name):
            self._acquired.set()
            await self._release.wait()

    async def acquire(self) -> None:
        self._holder = asyncio.create_task(self._hold())
        acquired = asyncio.create_task(self._acquired.wait())
        try:
            await asyncio.wait({self._holder, acquired}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._holder.cancel()
            raise
        finally:
            acquired.cancel()
        if self._holder.done():
            self._holder.result()  # the limiter failed: raise its error

    async def release(self) -> None:
        if self._holder is None:
            return
        holder, self._holder = self._holder, None
        self._release.set()
        await holder


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, PolarError) else f"{exc.__class__.__name__}: {exc}"


async def _release_runtimes(ctx: RolloutContext, view: RolloutView) -> None:
    """After a failure: the rollout's runtimes stop (no container left running); their files stay for a retry."""
    for runtime in (agent_runtime(ctx, view), eval_runtime(ctx, view)):
        try:
            await runtime.stop(remove=False)
        except Exception:
            log.exception("rollout %s: could not stop runtime %s", view.id, runtime.key)


async def _keep_partial_work(ctx: RolloutContext, view: RolloutView, owner: str) -> None:
    """After a failure: no more captures, whatever was captured stored as masked ERROR trajectories, and the
    rollout's runtimes stopped."""
    await _release_runtimes(ctx, view)
    try:
        await ctx.gateway.close_session(view.id)
    except PolarError as exc:
        log.warning("rollout %s: could not close its session: %s", view.id, exc.message)
    try:
        await asyncio.to_thread(
            build_trajectories,
            ctx,
            view.id,
            builder=view.task.builder,
            status=RolloutStatus.ERROR,
            aligned_agent_timeout=False,
        )
    except Exception:
        log.exception("rollout %s: could not build trajectories after a failure", view.id)


async def drive_rollout(
    ctx: RolloutContext,
    rollout_id: str,
    owner: str,
    *,
    limiter: Limiter,
    call: StageCall | None = None,
    takeover: bool = False,
    stale_after_s: float | None = None,
    owner_gone: OwnerProbe | None = None,
) -> RolloutSummary:
    """Run ``rollout_id`` to a final status as flow run ``owner``. Raises the stage's error if one failed."""
    settings = ctx.settings
    view = await asyncio.to_thread(
        state.claim,
        ctx.factory,
        rollout_id,
        owner,
        default_timeout_s=settings.rollout_timeout_s,
        stale_after_s=settings.stale_after_s if stale_after_s is None else stale_after_s,
        takeover=takeover,
        owner_gone=owner_gone,
    )
    if view.status.is_terminal:
        return RolloutSummary(rollout_id, view.status, None, None, tuple(s.value for s in view.done))
    beat = asyncio.create_task(_keep_alive(ctx, rollout_id, owner))
    try:
        return await _drive(ctx, view, owner, limiter=limiter, call=call)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat


async def _keep_alive(ctx: RolloutContext, rollout_id: str, owner: str) -> None:
    while True:
        await asyncio.sleep(ctx.settings.heartbeat_s)
        try:
            await asyncio.to_thread(state.heartbeat, ctx.factory, rollout_id, owner)
        except Exception:
            log.warning("rollout %s: heartbeat failed", rollout_id, exc_info=True)


async def _drive(
    ctx: RolloutContext, view: RolloutView, owner: str, *, limiter: Limiter, call: StageCall | None
) -> RolloutSummary:
    settings, rollout_id = ctx.settings, view.id
    if Stage.INIT in view.done and Stage.RUN not in view.done and not agent_runtime(ctx, view).exists():
        # A launch the run stage recorded stays: it is set aside (and the harness launched again) there.
        await asyncio.to_thread(
            state.reopen_stage, ctx.factory, rollout_id, Stage.INIT, owner, keep_progress=(Stage.RUN,)
        )
        view = await asyncio.to_thread(
            state.load, ctx.factory, rollout_id, default_timeout_s=settings.rollout_timeout_s
        )
    call = call or direct_call(ctx, rollout_id, owner)
    done = view.done
    current = Stage.INIT
    ready = _HeldSlot(limiter, "ready")
    try:
        try:
            if Stage.RUN not in done:
                await ready.acquire()
            async with _slot(limiter, "init", Stage.INIT not in done):
                await call(Stage.INIT, view)
            current = Stage.RUN
            async with _slot(limiter, "run", Stage.RUN not in done):
                if Stage.RUN not in done:  # the runtime leaves the READY buffer as it starts running
                    await asyncio.to_thread(state.enter_stage, ctx.factory, rollout_id, Stage.RUN, owner)
                await ready.release()
                await call(Stage.RUN, view)
        finally:
            await ready.release()
        current = Stage.POSTRUN
        async with _slot(limiter, "postrun", Stage.POSTRUN not in done):
            await call(Stage.POSTRUN, view)
        current = Stage.EVALUATE
        await call(Stage.EVALUATE, view)
    except RolloutClaimed:
        raise  # another flow run took the rollout over: it is not ours to mark
    except Exception as exc:
        log.warning("rollout %s: %s failed: %s", rollout_id, current, _describe(exc))
        await asyncio.to_thread(state.mark_failed, ctx.factory, rollout_id, current, owner, _describe(exc))
        await _keep_partial_work(ctx, view, owner)
        raise
    final = await asyncio.to_thread(state.load, ctx.factory, rollout_id, default_timeout_s=settings.rollout_timeout_s)
    results = final.results
    error = results.run.error if results.run is not None else None
    reward = results.evaluate.reward if results.evaluate is not None else None
    return RolloutSummary(rollout_id, final.status, reward, error, tuple(s.value for s in done))


async def drive_rollouts(
    ctx: RolloutContext, rollout_ids: Sequence[str], owner: str, *, limiter: Limiter
) -> list[RolloutSummary | BaseException]:
    """Every rollout concurrently, without Prefect (benchmarks, tests); failures are returned, not raised."""
    return await asyncio.gather(
        *(drive_rollout(ctx, rollout_id, f"{owner}-{rollout_id}", limiter=limiter) for rollout_id in rollout_ids),
        return_exceptions=True,
    )
