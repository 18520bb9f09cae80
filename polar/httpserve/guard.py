"""Credentials before the body, and a size limit on every body, in front of an ASGI app.

FastAPI reads and parses a route's body before its dependencies run, so a token checked in a dependency is
checked only after the whole upload was held in memory and parsed: a 1 GiB body without a token cost 2 GB and
was answered 400 (its JSON), not 401. ``BodyGuard`` sits in front of the app and decides from the request's line
and headers alone (``Screen``), before a byte of the body is read:

- ``refusal``: the request is answered with it (the app's error shape, ``Connection: close``) and the app never
  runs; the body is never read, and closing the connection stops the upload;
- ``withhold``: the app runs, but sees an empty body (its own guard answers, in its own shape: the web UI's page);
- ``limit``: a declared ``Content-Length`` past it is a 413 at once; otherwise the bytes are counted as the app
  reads them, and the first chunk past the limit (chunked uploads included) is answered 413 there and then: the
  app is told the caller hung up, and whatever it answers after that is dropped.

The gateway follows the same rule inside its routes (the key first, then ``polar.httpserve.body.read_body``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from polar.errors import PayloadTooLarge, PolarError


@dataclass(frozen=True)
class Screen:
    """What the guard does with one request, decided from its headers."""

    limit: int
    refusal: PolarError | None = None
    withhold: bool = False


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of request header ``name`` (lower case), decoded as Latin-1 as HTTP defines it."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class BodyGuard:
    """ASGI middleware: ``screen(scope)`` per HTTP request; ``shape(exc)`` is the response of a refusal."""

    def __init__(self, app: ASGIApp, screen: Callable[[Scope], Screen], shape: Callable[[PolarError], Response]):
        self.app = app
        self.screen = screen
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        screen = self.screen(scope)
        refusal = screen.refusal or _declared_too_large(scope, screen.limit)
        if refusal is not None:
            await self._answer(refusal, scope, receive, send)
            return
        if screen.withhold:
            await self.app(scope, _empty_body(receive), send)
            return
        await _Limited(self, screen.limit, scope, receive, send).run()

    async def _answer(self, exc: PolarError, scope: Scope, receive: Receive, send: Send) -> None:
        reply = self.shape(exc)
        # The body was not read: the connection cannot carry another request, and closing it ends the upload.
        reply.headers["connection"] = "close"
        await reply(scope, receive, send)


def _declared_too_large(scope: Scope, limit: int) -> PolarError | None:
    declared = header(scope, b"content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit", field="body")
    return None


def _empty_body(receive: Receive) -> Receive:
    sent = False

    async def empty() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()  # after the body: only the disconnect is left to wait for

    return empty


class _Limited:
    """One request whose body is counted as the app reads it."""

    def __init__(self, guard: BodyGuard, limit: int, scope: Scope, receive: Receive, send: Send):
        self.guard, self.limit, self.scope = guard, limit, scope
        self._receive, self._send = receive, send
        self.read = 0
        self.started = False  # the app began its response
        self.answered = False  # the guard answered 413 itself: the app's messages go nowhere

    async def run(self) -> None:
        await self.guard.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.answered:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit:
                if not self.started:
                    self.answered = True
                    exc = PayloadTooLarge(f"request body exceeds the {self.limit}-byte limit", field="body")
                    await self.guard._answer(exc, self.scope, self._receive, self._send)
                return {"type": "http.disconnect"}  # the app stops reading: to it, the caller hung up
        return message

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
