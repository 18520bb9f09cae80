"""Backpressure: a bounded number of calls in flight per inference server: never a hang, never a 500.

Each inference server URL has its own bound (``ServerLimits``): a call takes a slot of the server its session
routes to (a fleet's rendezvous ranking, ``polar.backends.fleet``; the one server otherwise), so the gateway's
``/metrics`` shows calls in flight and queued per server URL. A call that fails over to another server mid-way
stays counted on the server it took its slot from until it ends.

A call takes a slot before its generation starts and gives it back when the generation ends (a stream: when
its last frame is sent or its client goes away). Beyond the bound, calls wait in arrival order for at most
the queue deadline, then fail with ``Overloaded``, which each protocol turns into its provider's overload
error with ``Retry-After``. Waiting never blocks the event loop; a freed slot goes at once to the next waiter.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from polar import metrics
from polar.backends.fleet import FleetBackend, parse_urls
from polar.errors import Overloaded
from polar.inference import Backend


class InFlightLimit:
    """At most ``max_in_flight`` holders at once (0: no bound); ``in_flight`` and ``queued`` are for metrics."""

    def __init__(self, name: str, max_in_flight: int, queue_timeout_s: float, backend: str = ""):
        self.name = name
        self.backend = backend
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
                    metrics.OVERLOADED.labels(self.backend, self.name).inc()
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


class ServerLimits:
    """One ``InFlightLimit`` per inference server URL; ``route`` names the server a session's calls go to (by the
    session id, else the call's id). ``in_flight`` and ``queued`` are the totals over the servers."""

    def __init__(
        self,
        backend: str,
        servers: Sequence[str],
        route: Callable[[str], str],
        max_in_flight: int,
        queue_timeout_s: float,
    ):
        self.route = route
        self.servers = {url: InFlightLimit(url, max_in_flight, queue_timeout_s, backend) for url in servers}
        for url, limit in self.servers.items():
            metrics.track(backend, url, _reader(limit, "in_flight"), _reader(limit, "queued"))

    def of(self, key: str) -> InFlightLimit:
        return self.servers[self.route(key)]

    @property
    def in_flight(self) -> int:
        return sum(limit.in_flight for limit in self.servers.values())

    @property
    def queued(self) -> int:
        return sum(limit.queued for limit in self.servers.values())


def _reader(limit: InFlightLimit, count: str) -> Callable[[], float]:
    return lambda: float(getattr(limit, count))


def servers_of(backend: Backend, backend_url: str | None) -> tuple[list[str], Callable[[str], str]]:
    """The inference server URLs behind ``backend`` and the route from a session (else call) id to one of them: a
    fleet's members and its ranking; one server's URL (``POLAR_BACKEND_URL``); the kind (``local``) without one."""
    if isinstance(backend, FleetBackend):
        return [m.url for m in backend.members], backend.server_for
    urls = parse_urls(backend_url) if backend_url and backend.name != "local" else [backend.name]
    return urls[:1], lambda _key: urls[0]
