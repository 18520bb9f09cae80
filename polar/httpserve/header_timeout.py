"""A deadline on request headers for both HTTP servers (the gateway and ``polar serve``).

uvicorn times out a connection only while it idles between requests (keep-alive): a socket that connects and
never finishes its request line and headers is held forever, so a few thousand silent sockets exhaust the
server's file descriptors. ``with_header_timeout(timeout_s)`` is uvicorn's httptools protocol (the one it picks
itself: httptools is a pinned dependency; ``http=`` takes a class) plus one timer, armed when a connection opens
and when the first byte of each later request is parsed (pipelined ones included), disarmed when that request's
headers are complete. A connection still without complete headers when it fires is closed. Between requests the
keep-alive timeout applies as before; bodies are not covered: the routes that read one bound it themselves.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout_s: float = 15.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # from the connection's first moment: a socket that sends nothing is closed too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # the first request's deadline runs from connection_made
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # A request pipelined behind one still being answered: that answer is never cut off; the unfinished
            # headers behind it get a fresh deadline (the one in flight is bounded by its own route).
            self._arm()
        elif not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, closing connections whose request headers take over ``timeout_s``."""
    return type("HeaderTimeoutProtocol", (_HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})
