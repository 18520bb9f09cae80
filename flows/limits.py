"""Stage limits counted fleet-wide by the Prefect server (``POLAR_STAGE_LIMITS=prefect``).

Each slot (``ready``, ``init``, ``run``, ``postrun``) is a Prefect global concurrency limit named
``polar-<slot>``, so every worker's rollouts share one count: more workers on the pool add throughput but never
exceed the limits. ``ensure_limits`` creates or resizes the limits from the settings; the batch and retry flows
call it before dispatching. Slots are leases the Prefect client renews while held, so a crashed flow's slots
come back when its lease expires.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.concurrency.asyncio import concurrency
from prefect.exceptions import ObjectNotFound

from polar.rollout.limits import Limiter, process_limiter, stage_limits
from polar.settings import LimitScope, Settings

PREFIX = "polar-"


class PrefectLimiter:
    @asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        async with concurrency(PREFIX + name, occupy=1, strict=True):
            yield


async def ensure_limits(settings: Settings) -> dict[str, int]:
    """Create or resize the ``polar-*`` global concurrency limits; returns them."""
    limits = {PREFIX + name: size for name, size in stage_limits(settings).items()}
    async with get_client() as client:
        for name, size in limits.items():
            try:
                await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
            else:
                await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=size))
    return limits


def make_limiter(settings: Settings) -> Limiter:
    return PrefectLimiter() if settings.stage_limits is LimitScope.PREFECT else process_limiter(settings)
