"""Silence on a backend's connection (``polar.backends.http1``): a call whose backend sends nothing for its timeout
fails with ``TimeoutError``, at the cost of one timer a call, or, for the streams being read, of one look at each
open stream per tick (never a timer per read)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol


class Watched(Protocol):
    """A call whose silence is watched: when its bytes last came, whether its stream is being read, and how it ends."""

    last_read: float  # loop time
    watched: bool  # a stream whose lines are being read: its silence is IdleWatch's

    def fail(self, error: BaseException) -> None: ...


class IdleWatch:
    """Fails the streams whose backend has sent nothing for ``idle_s``: their reader raises ``TimeoutError``.

    A timer per read (aiohttp's ``sock_read``) was 5% of the gateway's samples at 1,000 streams in flight. This looks
    at each open stream once per tick instead: a stream is cut after between ``idle_s`` and ``idle_s`` plus a tick
    of silence."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self.tick_s = min(1.0, idle_s / 4)
        self._open: set[Watched] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, reply: Watched) -> None:
        self._open.add(reply)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def forget(self, reply: Watched) -> None:
        self._open.discard(reply)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._open:
            await asyncio.sleep(self.tick_s)
            silent_since = loop.time() - self.idle_s
            for reply in [r for r in self._open if r.last_read < silent_since]:
                self._open.discard(reply)
                reply.fail(TimeoutError(f"the backend sent nothing for {self.idle_s:g} s"))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._open.clear()


class SilenceTimer:
    """Fails ``reply`` with ``TimeoutError`` once the backend has sent nothing for ``timeout_s``, until its response
    is whole or its stream's lines are read (``IdleWatch`` then). Re-armed only when it fires."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, reply: Watched):
        self._loop, self._timeout_s, self._reply = loop, timeout_s, reply
        self._handle: asyncio.TimerHandle | None = loop.call_at(reply.last_read + timeout_s, self._fire)

    def _fire(self) -> None:
        reply = self._reply
        if reply.watched:
            self._handle = None
            return
        due = reply.last_read + self._timeout_s
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._fire)
            return
        self._handle = None
        reply.fail(TimeoutError(f"the backend sent nothing for {self._timeout_s:g} s"))

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
