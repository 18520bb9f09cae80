"""The Prefect adapter: the one module of the library that talks to Prefect (``flows/`` are Prefect's own).

- Fleet-wide stage limits: each slot (``ready``, ``init``, ``run``, ``postrun``) is a Prefect global concurrency
  limit named ``polar-<slot>``, so every worker's rollouts share one count. ``ensure_limits`` creates the missing
  ones (and resizes the rest to the caller's settings); ``PrefectLimiter`` holds slots, each a lease of
  ``POLAR_LIMIT_LEASE_S`` renewed by Prefect's client while held, and creates a limit it finds missing without
  resizing it. Creation races between processes are harmless: whoever loses reads the winner's limit.
- Deployment runs for the control API: ``start_deployment_run`` (idempotent by key), ``cancel_flow_runs``,
  ``flow_run_states``.

Which server is used is Prefect's own setting, ``PREFECT_API_URL``; the library reads it only as
``Settings.prefect_api_url`` (unset: Prefect's ephemeral in-process server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.asyncio import concurrency
from prefect.deployments import arun_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import Cancelled, Cancelling

from polar.rollout.limits import stage_limits
from polar.settings import Settings

PREFIX = "polar-"


async def ensure_limits(settings: Settings, *, resize: bool = True) -> dict[str, int]:
    """Create the ``polar-*`` global concurrency limits that are missing (and with ``resize`` set the existing
    ones to these settings' sizes); returns the limits as these settings size them."""

    limits = {PREFIX + name: size for name, size in stage_limits(settings).items()}
    async with get_client() as client:
        for name, size in limits.items():
            try:
                current = await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
                    continue
                except ObjectAlreadyExists:  # another process created it a moment ago
                    current = await client.read_global_concurrency_limit_by_name(name)
            if resize and current.limit != size:
                await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=size))
    return limits


class PrefectLimiter:
    """Slots of the ``polar-*`` global concurrency limits; a missing limit is created (not resized) on first use."""

    def __init__(self, settings: Settings):
        self.settings = settings

    @asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:

        lease_s = self.settings.limit_lease_s
        entered = False
        try:
            async with concurrency(PREFIX + name, occupy=1, strict=True, lease_duration=lease_s):
                entered = True
                yield
            return
        except ConcurrencySlotAcquisitionError:
            if entered:
                raise
        await ensure_limits(self.settings, resize=False)
        async with concurrency(PREFIX + name, occupy=1, strict=True, lease_duration=lease_s):
            yield


async def cancel_flow_runs(flow_run_ids: list[str]) -> None:
    """Cancel deployment runs: Cancelled if not started yet, Cancelling (the worker kills it) if running."""

    async with get_client() as client:
        for flow_run_id in flow_run_ids:
            run = await client.read_flow_run(UUID(flow_run_id))
            running = run.state is not None and (run.state.is_running() or run.state.is_pending())
            if run.state is not None and run.state.is_final():
                continue
            await client.set_flow_run_state(UUID(flow_run_id), Cancelling() if running else Cancelled(), force=True)


async def flow_run_states(flow_run_ids: list[str]) -> dict[str, str]:
    """Flow run id -> the name of its state on the Prefect server."""
    if not flow_run_ids:
        return {}
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(i) for i in flow_run_ids]))
        )
    return {str(run.id): run.state.name if run.state and run.state.name else "unknown" for run in runs}


async def start_deployment_run(deployment: str, parameters: dict[str, Any], idempotency_key: str) -> str:
    """Create one flow run of ``deployment`` without waiting for it; returns its id. The same key gives the
    same run (a retried dispatch starts nothing new)."""
    run = await arun_deployment(deployment, parameters=parameters, timeout=0, idempotency_key=idempotency_key)
    return str(run.id)
