"""Stage limits counted fleet-wide by the Prefect server, and which kind of limits a process uses.

Each slot (``ready``, ``init``, ``run``, ``postrun``) is a Prefect global concurrency limit named
``polar-<slot>``, so every worker's rollouts share one count: more workers on the pool add throughput but never
exceed the limits. ``POLAR_STAGE_LIMITS=auto`` (the default) counts fleet-wide whenever a Prefect server is
configured (``PREFECT_API_URL``) and per process otherwise (the embedded mode, where every rollout flow of a
batch runs in one process).

The limits are created idempotently by whoever needs them: the batch and retry flows and the control API create
or resize them from their settings before dispatching (``ensure_limits``), and a rollout flow that finds one
missing (a worker's first flow run, a control-API rollout on a fresh server) creates it without resizing it.
Creation races between processes are harmless: whoever loses reads the winner's limit.

Each slot is a lease of ``POLAR_LIMIT_LEASE_S`` (default 60 s, the least the Prefect server accepts; Prefect's own
default is 300 s) that the Prefect client renews while it is held (a thread renews it every 3/4 of the lease, and
the holder is cancelled if renewal fails, so no slot is ever used unleased). A holder killed with ``kill -9`` (a
dead worker host) renews nothing: the server's repossessor frees its slot once the lease has run out, within
``PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS`` (default 15) after that, and the rest of the fleet goes on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from polar.rollout.limits import stage_limits
from polar.settings import LimitScope, Settings

log = logging.getLogger(__name__)
PREFIX = "polar-"


def prefect_configured() -> bool:
    """Whether this process talks to a Prefect server (not Prefect's ephemeral in-process one)."""
    return bool(os.environ.get("PREFECT_API_URL"))


def limit_scope(settings: Settings) -> LimitScope:
    """``POLAR_STAGE_LIMITS`` with ``auto`` resolved."""
    if settings.stage_limits is not LimitScope.AUTO:
        return settings.stage_limits
    return LimitScope.PREFECT if prefect_configured() else LimitScope.PROCESS


_warned: set[str] = set()


def warn_unbounded(settings: Settings, where: str) -> str | None:
    """Warn (once per process and place) when process-local limits are used where each rollout flow runs in a
    process of its own (a Prefect process pool), so they bound nothing; returns the warning given, if any."""
    if limit_scope(settings) is not LimitScope.PROCESS:
        return None
    message = (
        f"{where}: POLAR_STAGE_LIMITS is process-local but rollout flows run in processes of their own (a Prefect "
        "process pool): the stage limits and the READY buffer bound nothing; set POLAR_STAGE_LIMITS=prefect "
        "(or auto with PREFECT_API_URL)"
    )
    if where not in _warned:
        _warned.add(where)
        log.warning(message)
    return message


async def ensure_limits(settings: Settings, *, resize: bool = True) -> dict[str, int]:
    """Create the ``polar-*`` global concurrency limits that are missing (and with ``resize`` set the existing
    ones to these settings' sizes); returns the limits as these settings size them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

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
        from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
        from prefect.concurrency.asyncio import concurrency

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
