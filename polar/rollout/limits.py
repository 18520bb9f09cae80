"""Stage concurrency limits and the READY buffer, as the pipeline driver sees them: named slots.

``init``, ``run`` and ``postrun`` bound how many rollouts are in each stage. ``ready`` bounds the runtimes that
exist but are not running yet: a rollout takes a ready slot before its init starts and gives it back when it
gets a run slot, so init never races far ahead of run (and never holds more than ``ready_buffer`` prepared
runtimes waiting). Deadlock-free: a rollout holding a ready slot is either initialising or waiting for a run
slot, and run slots are freed by rollouts that hold no ready slot.

``ProcessLimiter`` counts in this process (asyncio semaphores, one set per event loop: every rollout flow of an
in-process batch shares it). The flows layer adds a Prefect limiter that counts fleet-wide across workers.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from polar.settings import Settings

SLOTS = ("ready", "init", "run", "postrun")


def stage_limits(settings: Settings) -> dict[str, int]:
    return {
        "ready": settings.ready_buffer,
        "init": settings.init_concurrency,
        "run": settings.run_concurrency,
        "postrun": settings.postrun_concurrency,
    }


class Limiter(Protocol):
    def slot(self, name: str) -> AbstractAsyncContextManager[None]:
        """Hold one slot of ``name`` (one of ``SLOTS``) for the block."""


class ProcessLimiter:
    def __init__(self, limits: Mapping[str, int]):
        self.limits = dict(limits)
        self._semaphores = {name: asyncio.Semaphore(size) for name, size in self.limits.items()}

    @asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        async with self._semaphores[name]:
            yield


class NoLimits:
    @asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        yield


_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[tuple[str, int], ...], ProcessLimiter]] = (
    weakref.WeakKeyDictionary()
)


def process_limiter(settings: Settings) -> ProcessLimiter:
    """The limiter of this event loop for ``settings``' limits (shared by all rollouts running in the loop)."""
    limits = stage_limits(settings)
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    key = tuple(sorted(limits.items()))
    if key not in per_loop:
        per_loop[key] = ProcessLimiter(limits)
    return per_loop[key]
