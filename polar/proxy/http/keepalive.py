"""Keep-alive for long calls: proxies and tunnels that cut connections idle for 60-120 s must not kill them.

A non-streaming call that has produced nothing for ``every_s`` seconds starts its 200 response and sends one
space every ``every_s`` seconds until the JSON body follows (JSON allows leading whitespace, and every official
SDK parses it). A call that finishes sooner is an ordinary response with its own status. Once the headers are
out an error can no longer change the status: its provider-shaped error body follows the whitespace instead.

A stream whose first token has not come within ``every_s`` seconds (a long prefill, a queue) starts its
``text/event-stream`` response and sends an empty line every ``every_s`` seconds until it does: in SSE an empty
line with no field before it dispatches nothing. Not an SSE comment (``: keep-alive``): google-genai's stream
reader takes any line that is neither ``data: ...`` nor empty for a JSON chunk and fails on it (the OpenAI and
Anthropic SDKs skip both). An error before the first token is then the protocol's in-stream error event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from polar.errors import PolarError
from polar.httpserve.body import FastJSONResponse
from polar.proxy.call.complete import Reply
from polar.proxy.call.plan import CallPlan
from polar.proxy.http import errors
from polar.proxy.http.delivery import handed_over, undelivered_once_done
from polar.proxy.http.stream_response import aclose
from polar.wire import ProtocolCodec

SPACE = b" "
SSE_IDLE = b"\n"


async def first_within(task: asyncio.Task[Any], every_s: float) -> bool:
    """Whether ``task`` finished within ``every_s`` seconds (it is never cancelled here)."""
    done, _ = await asyncio.wait({task}, timeout=every_s)
    return bool(done)


async def padded_json(
    task: asyncio.Task[Reply], every_s: float, codec: ProtocolCodec, undelivered: Callable[[int], None]
) -> AsyncIterator[bytes]:
    """Spaces every ``every_s`` seconds until ``task`` ends, then its JSON (or its error's body in ``codec``'s
    shape). A client that leaves does not stop the call: its capture is still committed, and marked undelivered
    (``undelivered(capture_id)``) unless its body was handed over before the client left
    (``polar.proxy.http.delivery``)."""
    handed = False
    try:
        while not await first_within(task, every_s):
            yield SPACE
        try:
            body = bytes(FastJSONResponse(task.result().body).body)
        except PolarError as exc:
            handed = True  # no reply to deliver: its error capture is no reply
            yield errors.call_failed_body(codec, exc)
            return
        yield body
        await handed_over()
        handed = True
    finally:
        if not handed:
            undelivered_once_done(task, undelivered)


async def padded_stream(
    opening: asyncio.Task[Any],
    every_s: float,
    frames_of: Callable[[Any], AsyncIterator[bytes]],
    plan: CallPlan,
) -> AsyncIterator[bytes]:
    """Empty SSE lines every ``every_s`` seconds until ``opening`` (the stream's start) ends, then its frames; an
    error before the first token becomes the protocol's error event (``plan``'s)."""
    try:
        while not await first_within(opening, every_s):
            yield SSE_IDLE
        try:
            opened = opening.result()
        except PolarError as exc:
            for frame in errors.stream_failed_frames(plan, exc):
                yield frame
            return
        frames = frames_of(opened)
        try:
            async for frame in frames:
                yield frame
        finally:
            await aclose(frames)  # left at a yield (the client left while a frame was sent): it ends now
    finally:
        if not opening.done():  # the client left during the wait: stop the generation
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
