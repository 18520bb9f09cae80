"""A caller of the capture writer, waiting on its event loop for its row's commit, and how its wait runs out."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from db import Capture


@dataclass(frozen=True)
class Stored:
    """Where a committed capture landed."""

    id: int
    seq: int


@dataclass(eq=False)
class Pending:
    row: Capture
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Stored]
    key_hash: str | None = None  # commit only while the session is open under this key (None: unchecked)
    expired: bool = False  # its caller's wait ran out (``expire``)


def expire(pending: Pending) -> None:
    if not pending.future.done():
        pending.expired = True
        pending.future.cancel()


class Waits:
    """The deadlines of the callers waiting on one event loop, run out by one timer. Every caller of the gateway
    waits as long (``store_timeout_s``), so deadlines arrive in order and queue at the back; the timer is armed for
    the front. A timer per call (a handle, a heap push and its cancel) cost a tenth of the writer's throughput
    (``bench_gateway_scale.py`` section 4). A wait shorter than one already queued gets a timer of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: deque[tuple[float, Pending]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, pending: Pending, timeout_s: float) -> asyncio.TimerHandle | None:
        """Expire ``pending`` after ``timeout_s``; a handle to cancel when it got a timer of its own."""
        deadline = self.loop.time() + timeout_s
        queue_ = self.queue
        while queue_ and queue_[0][1].future.done():  # answered already: the queue holds about what is in flight
            queue_.popleft()
        if queue_ and deadline < queue_[-1][0]:
            return self.loop.call_later(timeout_s, expire, pending)
        queue_.append((deadline, pending))
        if self.timer is None:
            self.timer = self.loop.call_at(deadline, self._run_out)
        return None

    def _run_out(self) -> None:
        self.timer = None
        now, queue_ = self.loop.time(), self.queue
        while queue_ and (queue_[0][0] <= now or queue_[0][1].future.done()):
            expire(queue_.popleft()[1])
        if queue_:
            self.timer = self.loop.call_at(queue_[0][0], self._run_out)
