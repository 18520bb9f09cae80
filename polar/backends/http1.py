"""The generation hot path's HTTP/1.1 client: a backend's ``/generate`` calls and streams.

A generate call needs one request on a kept-alive connection, a status, a few headers and a body (whole, or read
line by line as a stream). aiohttp, which did this before, spent 150-190 us of the event loop's CPU a call on
its request, response, connector, timer and trace machinery; this client, 100-120 us, writes the request in one
``writelines`` and parses the response with httptools, the parser uvicorn serves with
(``benchmarks/bench_backend_client.py`` measures all three). httpx, slower still at many calls in flight (its pool
looks at every connection for every request), stays for the control calls (weights, pauses, model info).

- Connections are kept alive per host and the latest one freed is reused first. One idle for ``KEEPALIVE_S`` is
  closed, not reused: a uvicorn-based server (SGLang) closes idle connections at 5 s, and a call must never go out
  on a connection the server is closing. No pool bound: the gateway bounds calls in flight per server
  (``polar.proxy.call.limits``). A connection is handed to a call in its turn (``polar.slices``), before and after
  it is opened: a thousand calls starting together otherwise open their connections, then write their requests,
  in one loop iteration.
- Timeouts: connecting, at most ``min(timeout_s, 10)`` s. Then silence: a backend that sends nothing for
  ``timeout_s`` before the headers, or while a whole body is read, fails the call with ``TimeoutError``. One timer
  a call, re-armed only when it fires (never one per read). A stream's silence is watched by ``IdleWatch`` once its
  lines are read: each open stream is looked at once per tick.
- A refused, reset or closed connection, and a response that is not HTTP/1.1, are ``BackendConnectionError``;
  both it and ``TimeoutError`` are in ``TRANSPORT_ERRORS``.
- Lines of a stream are split here, so one event may be any length (a cumulative SGLang chunk of a long output is
  large). A stream's reader that falls behind stops the socket's reads past ``STREAM_BUFFER`` bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson
from multidict import CIMultiDict

from polar.backends.silence import IdleWatch, SilenceTimer
from polar.slices import turn

KEEPALIVE_S = 3.0
STREAM_BUFFER = 1 << 22  # bytes a stream's reader may leave unread before the socket stops reading


class BackendConnectionError(ConnectionError):
    """The backend's connection failed: refused, reset, or closed before a whole response, or it answered
    something that is not HTTP/1.1."""


TRANSPORT_ERRORS = (BackendConnectionError, asyncio.TimeoutError)


class Reply:
    """A backend's response as the wire helpers read it (httpx's names): ``status_code``, ``headers``,
    ``reason_phrase``, then ``aread()`` and ``content``, or the body's lines as they come."""

    def __init__(self, connection: _Connection, loop: asyncio.AbstractEventLoop, idle: IdleWatch):
        self._connection = connection
        self._loop = loop
        self._idle = idle
        self.status_code = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.reason_phrase = ""
        self.content = b""
        self.last_read = loop.time()  # the latest bytes' arrival (the silence timer and IdleWatch read it)
        self.watched = False  # a stream whose lines are being read: its silence is IdleWatch's
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._headers_in = False
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the connection --------------------------------------------------------------------------------

    def headers_done(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status
        self.headers = CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        self._headers_in = True
        self._wake()

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self.watched and self._buffered > STREAM_BUFFER:
            self._connection.pause()
        self._wake()

    def finish(self) -> None:
        self._complete = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """The call ends with ``error`` (its connection closed), unless its response is already whole."""
        if self._complete or self._error is not None:
            return
        self._error = error
        self._connection.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until the next bytes, the end, or a failure; raises the failure."""
        if self._error is None:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error

    # -- read by the caller -----------------------------------------------------------------------------------

    async def headers_read(self) -> None:
        while not self._headers_in:
            await self._wait()

    async def aread(self) -> bytes:
        while not self._complete:
            await self._wait()
        self.content = b"".join(self._chunks)
        self._chunks.clear()
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
        """The complete lines of the body, grouped by the reads that completed them: a reader that falls behind
        gets everything that arrived meanwhile at once (``polar.backends.sglang`` then decodes one chunk, not many).
        From here on the stream's silence is ``IdleWatch``'s."""
        idle = self._idle
        self.watched = True
        idle.watch(self)
        pending = b""
        try:
            while True:
                if not self._chunks:
                    if self._complete:
                        break
                    await self._wait()
                    continue
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                self._connection.resume()
                await turn()  # a thousand streams' bytes arriving together are taken over several loop iterations
                if b"\n" not in data:
                    pending += data
                    continue
                *lines, pending = (pending + data).split(b"\n")
                yield [line.rstrip(b"\r").decode() for line in lines]
        finally:
            idle.forget(self)
        if pending:
            yield [pending.rstrip(b"\r").decode()]

    def release(self) -> None:
        """The caller is done: a whole response's connection is kept for the next call; any other is closed (the
        server then aborts what it was generating)."""
        if self._complete and self._error is None:
            self._connection.done()
        else:
            self._connection.close()


class _Connection(asyncio.Protocol):
    """One kept-alive connection to a backend, answering one call at a time (httptools parses its responses)."""

    def __init__(self, pool: list[_Connection], loop: asyncio.AbstractEventLoop):
        self._pool = pool
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.reply: Reply | None = None
        self.open = True
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._keep = False
        self._paused = False

    def send(self, reply: Reply, parts: list[bytes]) -> None:
        self.reply = reply
        assert self.transport is not None
        self.transport.writelines(parts)

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def done(self) -> None:
        """Back to the pool, unless the server said it closes it."""
        self.reply = None
        if not (self._keep and self.open):
            self.close()
            return
        self.idle_since = self._loop.time()
        self._pool.append(self)

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport

    def data_received(self, data: bytes) -> None:
        reply = self.reply
        if reply is None:  # bytes no call asked for: the connection cannot be trusted with the next one
            self.close()
            return
        reply.last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            reply.fail(BackendConnectionError(f"the backend's response is not HTTP/1.1: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.reply is not None:
            why = f": {exc}" if exc is not None else ""
            self.reply.fail(BackendConnectionError(f"the backend closed the connection before a whole response{why}"))

    # -- httptools callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers, self._reason = [], b""

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.reply is not None
        self._keep = self._parser.should_keep_alive()
        self.reply.reason_phrase = self._reason.decode("latin-1")
        self.reply.headers_done(self._parser.get_status_code(), self._headers)

    def on_body(self, body: bytes) -> None:
        assert self.reply is not None
        self.reply.feed(body)

    def on_message_complete(self) -> None:
        assert self.reply is not None
        self.reply.finish()


class _Target:
    """Where a URL's requests go, and the request head they share (all but the body's length)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.key = (parts.scheme, self.host, self.port)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        ).encode("latin-1")


class Client:
    """Kept-alive connections to backends, made on first use (inside the event loop)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.connect_s = min(timeout_s, 10.0)
        self._idle = IdleWatch(timeout_s)
        self._pools: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes) -> AsyncIterator[Reply]:
        """``async with client.post(url, body) as reply:``, the response once its headers are in. ``body`` is not
        held once sent: a stream's reply may last minutes, and a thousand in flight held their sent prompts."""
        target = self._targets.get(url) or self._targets.setdefault(url, _Target(url))
        loop = asyncio.get_running_loop()
        connection = await self._connection(target, loop)
        reply = Reply(connection, loop, self._idle)
        connection.send(reply, [target.head % len(body), body])
        del body
        timer = SilenceTimer(loop, self.timeout_s, reply)
        try:
            await reply.headers_read()
            yield reply
        finally:
            timer.cancel()
            reply.release()

    async def _connection(self, target: _Target, loop: asyncio.AbstractEventLoop) -> _Connection:
        pool = self._pools.setdefault(target.key, [])
        stale = loop.time() - KEEPALIVE_S
        while pool:
            connection = pool.pop()
            if connection.open and connection.idle_since > stale:
                return connection
            connection.close()
        await turn()
        try:
            transport, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(pool, loop), target.host, target.port, ssl=target.ssl),
                self.connect_s,
            )
        except OSError as exc:
            raise BackendConnectionError(f"cannot connect to {target.host}:{target.port}: {exc}") from exc
        connection.transport = transport  # uvloop may call ``connection_made`` only after this returns
        await turn()
        return connection

    async def aclose(self) -> None:
        await self._idle.aclose()
        for pool in self._pools.values():
            for connection in pool:
                connection.close()
        self._pools.clear()
