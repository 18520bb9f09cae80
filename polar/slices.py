"""Time slices on an event loop: no burst of calls holds the gateway's loop for long.

An event loop runs every ready callback of an iteration before it looks at timers and sockets again. When a
thousand calls arrive together (or a thousand streams have tokens at once), each doing a millisecond or two of
decoding, planning or parsing, one iteration takes seconds: every timer fires late (deadlines, keep-alive
bytes), new connections wait, and calls time out behind work that was never theirs (rLLM lost half of its
rollouts that way at 300 calls in flight).

``turn()`` is awaited before each such piece of work: as a request arrives, as a backend's bytes arrive, before a
streamed chunk is parsed into the client's frames (without this second turn the lag p99 at 1,000 streams was 250 ms,
not 100), as a commit returns, before a reply is parsed. Within ``slice_s`` of the first turn of an iteration it
returns at once; after that the caller waits in line, and at the start of each later iteration the first ``batch``
in line are woken, in order: those the new slice has room for go on, the rest wait again in their place. An
iteration so lasts about ``slice_s`` plus one piece of work, whatever the load, and a line of a thousand callers
costs an iteration only the ones it wakes (callers that polled with ``sleep(0)`` cost every iteration all of them:
at 1,000 streams, most of each iteration). The work is neither dropped nor reordered. Each event loop has its
own slices.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Waiter:
    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None


class TimeSlices:
    def __init__(self, slice_s: float = 0.005, loop: asyncio.AbstractEventLoop | None = None, batch: int = 64):
        self.slice_s = slice_s
        self.loop = loop  # the loop these slices belong to (``turn()``'s lookup)
        self.batch = batch  # callers woken per iteration
        self._started: float | None = None  # when the current iteration's first turn came
        self._ending = False  # ``_end`` is queued
        self._line: deque[_Waiter] = deque()  # callers waiting for a later iteration, in the order they came
        self.deferred = 0  # turns put off to a later iteration (a measure of how loaded the loop is)
        self.woken = 0  # wake-ups given to callers in line (what the line costs)

    def _end_soon(self) -> None:
        # Queued now, it runs early in the next iteration (ready callbacks run in the order they were queued):
        # a fresh slice there, and the first in line woken.
        if not self._ending:
            self._ending = True
            (self.loop or asyncio.get_running_loop()).call_soon(self._end)

    def _end(self) -> None:
        self._ending = False
        self._started = None
        for waiter in itertools.islice(self._line, self.batch):
            if waiter.future is not None and not waiter.future.done():
                waiter.future.set_result(None)
                self.woken += 1
        if self._line:
            self._end_soon()

    async def turn(self) -> None:
        """Return once this iteration has time left for the caller (at once, unless it has run past its slice or
        others are in line before it)."""
        waiter: _Waiter | None = None
        while True:
            if not self._line or self._line[0] is waiter:
                # The slice starts with the first caller that may go (those that only join the line do not start
                # it): the first ones woken always find room in the iteration they run in.
                now = time.perf_counter()
                if self._started is None:  # the first to go in an iteration always goes: one piece at least
                    self._started = now
                    self._end_soon()
                    go = True
                else:
                    go = now - self._started < self.slice_s
                if go:
                    if waiter is not None:
                        self._line.popleft()
                    return
            if waiter is None:
                waiter = _Waiter()
                self._line.append(waiter)
                self.deferred += 1
            waiter.future = (self.loop or asyncio.get_running_loop()).create_future()
            self._end_soon()
            try:
                await waiter.future
            except BaseException:  # cancelled in line: out of it, so the next ones are not held up
                self._line.remove(waiter)
                raise


# A thread runs one loop at a time: its slices are found without a lookup keyed by the loop (a weak mapping's
# lookup made a weak reference on every turn, several per call).
_local = threading.local()


def turn() -> Awaitable[None]:
    """``TimeSlices.turn`` on the running loop's slices."""
    loop = asyncio.get_running_loop()
    slices: TimeSlices | None = getattr(_local, "slices", None)
    if slices is None or slices.loop is not loop:
        slices = _local.slices = TimeSlices(loop=loop)
    return slices.turn()


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """``asyncio.to_thread(fn, *args)``, then a turn: hand-backs from threads come in bursts (a thousand first calls'
    renders or store reads finishing together), and what each caller does next is a piece of work like any other."""
    result = await asyncio.to_thread(fn, *args)
    await turn()
    return result


class SlicedRequests:
    """ASGI middleware: every HTTP request takes its turn before any routing or decoding is done for it."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await turn()
        await self.app(scope, receive, send)
