"""aiohttp for the generation hot path: a backend's ``/generate`` calls and streams.

Measured with ``benchmarks/bench_backend_client.py`` (the gateway's own request, a few thousand prompt ids, to
the instant backend, 2 cores): at 64 calls in flight httpx spends about 10 ms of CPU per call (its connection
pool looks at every connection for every request), aiohttp about 0.5 ms; at 1 in flight 2.7 ms against 0.7 ms;
a 64-way stream 11.9 ms against 2.2 ms. Control calls (weights, pauses, model info) stay on httpx.

``Reply`` gives an aiohttp response the few attributes the wire helpers (``polar.backends.sglang_wire``) read
from an httpx one. Lines of a stream are split here, so one event may be any length (aiohttp's own line reader
refuses lines beyond its buffer, and a cumulative SGLang chunk of a long output is large).

A backend silent for ``timeout_s`` is a ``TimeoutError``: until the response headers, by aiohttp's ``sock_read``;
in a stream's body, by ``IdleWatch``, because ``sock_read`` makes a new loop timer for every read of every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from polar.slices import turn

TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class IdleWatch:
    """Closes the streams whose backend has sent nothing for ``idle_s``; their reader raises ``TimeoutError``.

    aiohttp's ``sock_read`` does the same with a new loop timer for every read: one per chunk of every stream, 5% of
    the gateway's samples at 1,000 streams in flight (py-spy, bench_gateway_scale section 3; CPU per streamed call
    6.4-7.0 ms with it, 5.3-5.6 without). This looks at each open stream once per tick instead: a stream is cut
    after between ``idle_s`` and ``idle_s`` plus a tick of silence."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self.tick_s = min(1.0, idle_s / 4)
        self._open: set[Reply] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, reply: Reply) -> None:
        self._open.add(reply)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def forget(self, reply: Reply) -> None:
        self._open.discard(reply)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._open:
            await asyncio.sleep(self.tick_s)
            silent_since = loop.time() - self.idle_s
            for reply in [r for r in self._open if r.last_read < silent_since]:
                self._open.discard(reply)
                reply.expire()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._open.clear()


class Reply:
    """An aiohttp response as the wire helpers read it (httpx's names)."""

    def __init__(self, raw: aiohttp.ClientResponse, idle: IdleWatch):
        self._raw = raw
        self._idle = idle
        self.status_code = raw.status
        self.headers = raw.headers
        self.reason_phrase = raw.reason or ""
        self.content = b""
        self.last_read = 0.0  # loop time of the stream's latest read (IdleWatch)
        self.expired = False

    def expire(self) -> None:
        """The backend stayed silent too long: close the response (its reader then raises TimeoutError)."""
        self.expired = True
        self._raw.close()

    async def aread(self) -> bytes:
        self.content = await self._raw.read()
        return self.content

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON (orjson, then the standard parser for what orjson refuses, as httpx parses)."""
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError:
            return json.loads(self.content)

    async def aiter_line_batches(self) -> AsyncIterator[list[str]]:
        """The complete lines of the body, grouped by the read that completed them: a reader that falls behind
        gets everything that arrived meanwhile at once (``polar.backends.sglang`` then decodes one chunk, not many)."""
        idle, loop = self._idle, asyncio.get_running_loop()
        connection = self._raw.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None  # from here on the watch's, not a timer per read
            self.last_read = loop.time()
            idle.watch(self)
        pending = b""
        try:
            async for data in self._raw.content.iter_any():
                self.last_read = loop.time()
                await turn()  # a thousand streams' bytes arriving together are taken over several loop iterations
                if b"\n" not in data:
                    pending += data
                    continue
                *lines, pending = (pending + data).split(b"\n")
                yield [line.rstrip(b"\r").decode() for line in lines]
        except aiohttp.ClientConnectionError:
            if self.expired:
                raise TimeoutError(f"the backend sent nothing for {idle.idle_s:g} s") from None
            raise
        finally:
            idle.forget(self)
        if pending:
            yield [pending.rstrip(b"\r").decode()]

    async def aiter_lines(self) -> AsyncIterator[str]:
        async for lines in self.aiter_line_batches():
            for line in lines:
                yield line


class _SlicedConnector(aiohttp.TCPConnector):
    """A connection is handed to a request in its turn (``polar.slices``), before and after it is opened: a thousand
    calls starting together otherwise open their connections, and then write their requests, all in one loop
    iteration (measured: stalls of 60-90 ms at 1,000 streams)."""

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        await turn()
        connection = await super().connect(req, traces, timeout)
        await turn()
        return connection


class Client:
    """One aiohttp session, made on first use (inside the event loop, as aiohttp requires)."""

    def __init__(self, timeout_s: float):
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=min(timeout_s, 10.0), sock_connect=min(timeout_s, 10.0), sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._idle = IdleWatch(timeout_s)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No pool bound here: the gateway bounds calls in flight per server (polar.proxy.call.limits).
            # Idle connections are dropped before a uvicorn-based server (SGLang) closes them at 5 s, so a call never
            # goes out on a connection the server is closing.
            connector = _SlicedConnector(limit=0, keepalive_timeout=3.0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=True)
        return self._session

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes) -> AsyncIterator[Reply]:
        """``async with client.post(url, body) as reply:``, the response once its headers are in. ``body`` is not
        held once sent: a stream's reply may last minutes, and a thousand in flight held their sent prompts."""
        request = self.session().post(url, data=body, headers={"content-type": "application/json"})
        del body
        async with request as raw:
            yield Reply(raw, self._idle)

    async def aclose(self) -> None:
        await self._idle.aclose()
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
