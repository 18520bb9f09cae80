"""Backpressure: a bounded number of calls in flight per inference server: never a hang, never a 500.

A call takes a slot before its generation starts and gives it back when the generation ends (a stream: when
its last frame is sent or its client goes away). Beyond the bound, calls wait in arrival order for at most
the queue deadline, then fail with ``Overloaded``, which each protocol turns into its provider's overload
error with ``Retry-After``. Waiting never blocks the event loop; a freed slot goes at once to the next waiter.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from polar import metrics
from polar.errors import Overloaded


class InFlightLimit:
    """At most ``max_in_flight`` holders at once (0: no bound); ``in_flight`` and ``queued`` are for metrics."""

    def __init__(self, name: str, max_in_flight: int, queue_timeout_s: float):
        self.name = name
        self.max_in_flight = max_in_flight
        self.queue_timeout_s = queue_timeout_s
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight > 0 else None
        self.in_flight = 0
        self.queued = 0
        self.rejected = 0

    async def acquire(self) -> None:
        if self._slots is not None:
            if self._slots.locked() or self.queued:
                self.queued += 1
                try:
                    async with asyncio.timeout(self.queue_timeout_s):
                        await self._slots.acquire()
                except TimeoutError:
                    self.rejected += 1
                    metrics.OVERLOADED.labels(self.name).inc()
                    raise Overloaded(
                        f"the inference server {self.name!r} has {self.max_in_flight} calls in flight and this "
                        f"call waited {self.queue_timeout_s:g} s for a slot; retry later",
                        retry_after_s=max(1, math.ceil(self.queue_timeout_s / 4)),
                    ) from None
                finally:
                    self.queued -= 1
            else:
                await self._slots.acquire()
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        if self._slots is not None:
            self._slots.release()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
