"""How the batch and retry flows run many rollouts: in this process, or as deployment runs on the work pool.

``inline`` runs each rollout flow as a subflow of the caller, concurrently (at most ``POLAR_BATCH_MAX_ACTIVE``
in flight), sharing this process's stage limits: the embedded mode. ``deployment`` creates one flow run of the
rollout deployment (``POLAR_ROLLOUT_DEPLOYMENT``) per rollout, all at once, which whatever worker of the pool
is free picks up: the scale-out mode. There the in-flight cap is the pool's (each worker's ``--limit``, the
fleet-wide stage limits), not the batch's, so adding workers adds throughput; the batch waits for the flow runs
with one query per poll, however many there are. The idempotency key is the rollout and the calling flow run,
so a retried batch flow run does not create a second flow run for a rollout. Either way a rollout is claimed in
its row before it runs, so no rollout runs twice. Both have a circuit breaker (``POLAR_BATCH_MAX_CONSECUTIVE_ERRORS``,
``polar.rollout.breaker``): after that many rollouts in a row (in the order the batch sees them end) failed a stage
for good, the rollouts not yet started are cancelled (for deployments, their flow runs too) and ``BatchStopped``
is raised once the running ones have ended.

The caller names itself (``dispatcher``, ``polar.rollout.dispatcher``): only rollouts of tasks that runner holds
are started, the others are reported as not dispatched. The retry flow passes None: it resumes rollouts whoever
dispatched them, under the rollout claim's takeover rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments import arun_deployment
from prefect.runtime import flow_run
from prefect.states import Cancelled

from flows.limits import ensure_limits
from flows.rollout import rollout
from polar.errors import RolloutClaimed
from polar.rollout.breaker import CircuitBreaker
from polar.rollout.context import get_store
from polar.rollout.dispatcher import split_owned
from polar.rollout.fleet_limits import limit_scope, warn_unbounded
from polar.rollout.state import cancel_unstarted, never_started
from polar.settings import LimitScope, Settings

# Flow runs created at once (each is one API call) and read per poll (the server's page size).
CREATE_AT_ONCE = 16
READ_PAGE = 200
POLL_S = 1.0
NOT_DISPATCHED = "not dispatched"
DISPATCH_ROUNDS = 3  # an inline rollout whose flow run never started is dispatched again, this many tries in all
log = logging.getLogger(__name__)


class Dispatch(StrEnum):
    INLINE = "inline"
    DEPLOYMENT = "deployment"


def _outcome(result: Any) -> str:
    return "ok" if not isinstance(result, BaseException) else f"{result.__class__.__name__}: {result}"


def run_elsewhere(outcome: str) -> bool:
    """Whether an outcome of ``dispatch_rollouts`` says the rollout was not run here: not dispatched (another
    runner holds its task), or another flow run held its claim."""
    return outcome.startswith((NOT_DISPATCHED, f"{RolloutClaimed.__name__}:"))


class NotStarted(Exception):
    """A rollout the batch's circuit breaker kept from starting."""


async def _inline(
    rollout_ids: Sequence[str], settings: Settings, takeover: bool, stale_after_s: float | None
) -> list[Any]:
    gate = asyncio.Semaphore(settings.batch_max_active)
    breaker = CircuitBreaker(settings.batch_max_consecutive_errors)

    async def one(rollout_id: str) -> Any:
        async with gate:
            if breaker.tripped:
                raise NotStarted(rollout_id)
            try:
                result = await rollout(rollout_id, takeover=takeover, stale_after_s=stale_after_s)
            except Exception as exc:  # a stage failed for good: an infrastructure error of this batch
                breaker.record(_outcome(exc))
                raise
            breaker.record(None)
            return result

    results = await asyncio.gather(*(one(rollout_id) for rollout_id in rollout_ids), return_exceptions=True)
    if breaker.tripped:
        factory = await get_store(settings)
        unstarted = [rid for rid, result in zip(rollout_ids, results, strict=True) if isinstance(result, NotStarted)]
        cancelled = await asyncio.to_thread(cancel_unstarted, factory, unstarted, breaker.message(len(unstarted)))
        raise breaker.error(len(cancelled))
    return results


async def _deployment(
    rollout_ids: Sequence[str], settings: Settings, takeover: bool, stale_after_s: float | None
) -> list[Any]:
    parent = flow_run.get_id() or "none"
    gate = asyncio.Semaphore(CREATE_AT_ONCE)

    async def create(rollout_id: str) -> Any:
        async with gate:
            return await arun_deployment(
                settings.rollout_deployment,
                parameters={"rollout_id": rollout_id, "takeover": takeover, "stale_after_s": stale_after_s},
                timeout=0,
                idempotency_key=f"polar-rollout-{rollout_id}-{parent}",
            )

    created = await asyncio.gather(*(create(rollout_id) for rollout_id in rollout_ids), return_exceptions=True)
    results: dict[int, Any] = {i: run for i, run in enumerate(created) if isinstance(run, BaseException)}
    waiting: dict[UUID, int] = {run.id: i for i, run in enumerate(created) if not isinstance(run, BaseException)}
    breaker = CircuitBreaker(settings.batch_max_consecutive_errors)
    cancelled: list[str] | None = None  # set once the breaker trips
    async with get_client() as client:
        while waiting:
            ids = list(waiting)
            for start in range(0, len(ids), READ_PAGE):
                page = ids[start : start + READ_PAGE]
                runs = await client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=page)), limit=READ_PAGE
                )
                for run in runs:
                    if run.state is None or not run.state.is_final():
                        continue
                    index = waiting.pop(run.id)
                    ok = run.state.is_completed()
                    results[index] = run if ok else RuntimeError(f"flow run {run.name} ended {run.state.name}")
                    if cancelled is None:  # in the order the batch sees them end
                        breaker.record(None if ok else _outcome(results[index]))
            if breaker.tripped and cancelled is None:
                cancelled = await _stop_unstarted(client, rollout_ids, waiting, settings, breaker)
            if waiting:
                await asyncio.sleep(POLL_S)
    if cancelled is not None:  # raised once the runs that had started have ended
        raise breaker.error(len(cancelled))
    return [results[i] for i in range(len(rollout_ids))]


async def _stop_unstarted(
    client: Any, rollout_ids: Sequence[str], waiting: dict[UUID, int], settings: Settings, breaker: CircuitBreaker
) -> list[str]:
    """The tripped breaker of a deployment batch: the rollouts no worker has claimed yet are cancelled in the store
    (the claim decides, so one a worker took meanwhile runs on), then their flow runs in Prefect, so no worker
    picks them up; the batch still waits for the ones running. Returns the cancelled rollout ids."""
    pending = [rollout_ids[index] for index in waiting.values()]
    factory = await get_store(settings)
    message = breaker.message(len(pending))
    cancelled = await asyncio.to_thread(cancel_unstarted, factory, pending, message)
    chosen = set(cancelled)
    for run_id, index in list(waiting.items()):
        if rollout_ids[index] in chosen:
            await client.set_flow_run_state(run_id, Cancelled(message=message), force=True)
    return cancelled


async def dispatch_rollouts(
    rollout_ids: Sequence[str],
    *,
    dispatch: Dispatch,
    settings: Settings,
    dispatcher: str | None,
    takeover: bool = False,
    stale_after_s: float | None = None,
) -> dict[str, str]:
    """Run every rollout whose task ``dispatcher`` holds (None: every rollout, the retry flow's); returns rollout
    id -> how its flow run ended ("ok", the error, or "not dispatched: ..." for a rollout another runner owns).
    ``stale_after_s`` (the retry flow's) is how long an owner must have been silent before a takeover (None: the
    settings')."""
    refused: dict[str, str] = {}
    todo = list(rollout_ids)
    if dispatcher is not None:
        factory = await get_store(settings)
        todo, refused = await asyncio.to_thread(split_owned, factory, todo, dispatcher)
    if todo and limit_scope(settings) is LimitScope.PREFECT:
        await ensure_limits(settings)
    elif todo and dispatch is Dispatch.DEPLOYMENT:
        warn_unbounded(settings, "deployment dispatch")
    if not todo:
        results: list[Any] = []
    elif dispatch is Dispatch.INLINE:
        results = await _inline(todo, settings, takeover, stale_after_s)
    else:
        results = await _deployment(todo, settings, takeover, stale_after_s)
    ran = {rollout_id: _outcome(result) for rollout_id, result in zip(todo, results, strict=True)}
    return {r: ran[r] if r in ran else f"{NOT_DISPATCHED}: {refused[r]}" for r in rollout_ids}


async def run_inline(rollout_ids: list[str], settings: Settings, dispatcher: str) -> None:
    """The control API's inline dispatch (``polar.api.runner.InlineDispatch``): the rollout flows in this process.

    Every rollout that did not end well is logged with how its flow run ended. One whose flow run never started
    (the subflow raised before it claimed the rollout, e.g. the Prefect API refused or timed out) is dispatched
    again, up to ``DISPATCH_ROUNDS`` times in all; one that still never started is cancelled with the last error,
    so no trainer waits on a PENDING rollout that nothing will run."""
    factory = await get_store(settings)
    todo, failed = list(rollout_ids), {}
    for _ in range(DISPATCH_ROUNDS):
        outcomes = await dispatch_rollouts(todo, dispatch=Dispatch.INLINE, settings=settings, dispatcher=dispatcher)
        failed = {r: outcome for r, outcome in outcomes.items() if outcome != "ok" and not run_elsewhere(outcome)}
        for rollout_id, outcome in failed.items():
            log.warning("rollout %s: its flow run ended with %s", rollout_id, outcome)
        todo = await asyncio.to_thread(never_started, factory, list(failed))
        if not todo:
            return
    reason = f"its flow run never started in {DISPATCH_ROUNDS} tries; the last: {failed[todo[-1]]}"
    await asyncio.to_thread(cancel_unstarted, factory, todo, reason)
