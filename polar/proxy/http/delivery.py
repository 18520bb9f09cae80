"""A non-streamed reply is delivered only if its client was still there when the body was handed over.

Acknowledged means the client read it, streamed or not. A non-streamed reply commits before its body is sent
(``polar.proxy.call.complete``); then one of two things is true, and the capture says which:

- **sent**: every byte of the body went to the server while the connection was open. The body leaves as one
  ``more_body`` write, then an empty one (which waits while the server's write buffer is full: ASGI flow control),
  then one turn of the loop; no ``http.disconnect`` was seen up to there. Only then is the response ended.
- **not sent**: the client left first (a hedged call it dropped, its read timeout, a proxy that gave up) or a
  ``send`` raised. The committed capture is marked ``UNACKNOWLEDGED`` (``CallRecorder.undelivered``): never
  trained, never a parent. Nothing is sent to a client already gone.

A client's departure is seen through ``receive`` (an ASGI 2.3 server such as uvicorn reports it only there, and
latches it: a client that left during the generation is seen at once). The generation itself is not stopped when
a non-streamed caller leaves (unlike a stream): it finishes, commits and is marked, so its ids are on record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from polar.httpserve.body import FastJSONResponse
from polar.proxy.call.complete import Reply


class DeliveredJSON(FastJSONResponse):
    """``reply``'s body as JSON; ``undelivered()`` when its client left before the body was handed over."""

    def __init__(self, reply: Reply, undelivered: Callable[[], None]):
        super().__init__(reply.body)
        self.undelivered = undelivered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # pragma: no cover -- model routes are HTTP
            await super().__call__(scope, receive, send)
            return
        listener = asyncio.create_task(_departure(receive))
        delivered = False
        try:
            await asyncio.sleep(0)  # the listener's first step: a departure already latched is seen now
            if listener.done():
                return
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": True})  # drained, if it was full
            await asyncio.sleep(0)  # a departure seen while the body was handed over
            if listener.done():
                return
            delivered = True  # before the end: the server reports the ended response as a disconnect too
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            listener.cancel()
            if not delivered:
                self.undelivered()


async def handed_over() -> None:
    """One turn of the loop after a body was handed to the server: in a ``StreamResponse`` (a padded body), a
    departure its listener saw by then cancels the caller here."""
    await asyncio.sleep(0)


def undelivered_once_done(call: asyncio.Task[Reply], undelivered: Callable[[int], None]) -> None:
    """``undelivered(capture_id)`` once ``call`` has committed its reply (now, if it has); nothing if it failed."""

    def settle(done: asyncio.Task[Reply]) -> None:
        if not done.cancelled() and done.exception() is None:
            undelivered(done.result().capture_id)

    call.add_done_callback(settle)


async def _departure(receive: Receive) -> None:
    # The body was read whole before the call began, so the next receive returns only when the client leaves. A
    # receive that fails is taken for a departure: the reply is then not counted as read (fail closed).
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 -- any failure of the server's receive: the client is not known to be there
        return
