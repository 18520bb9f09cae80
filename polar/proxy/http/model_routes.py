"""The model routes: the four provider protocols, token counting, and the model list.

A model route hands the caller's key and a body reader to the call pipeline (``polar.proxy.call.service``) and
shapes only the response: JSON or SSE, with keep-alive bytes while a slow call runs (``keepalive``); a JSON reply
whose client left before it was handed over is marked undelivered (``delivery``). The route's
protocol (``polar.proxy.http.routes``) is the one it speaks and answers errors in (``polar.proxy.http.errors``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from polar.errors import NotFound, PolarError
from polar.httpserve.body import read_body
from polar.proxy.gateway import Gateway
from polar.proxy.http import errors, keepalive
from polar.proxy.http.delivery import DeliveredJSON
from polar.proxy.http.route_table import Route
from polar.proxy.http.served import api_key, served
from polar.proxy.http.stream_response import StreamResponse, aclose
from polar.wire import ProtocolCodec

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def model_call(request: Request, route: Route) -> Response:
    """A call in ``route.protocol`` (the OpenAI, Responses and Anthropic routes)."""
    return await _model_call(served(request).gateway, request, route.protocol)


async def gemini(request: Request, route: Route) -> Response:
    """``/v1beta/models/{model}:{method}``: a call, streamed or not, or its token count."""
    model, _, method = request.path_params["target"].partition(":")
    codec = route.protocol
    if method in ("generateContent", "streamGenerateContent"):
        gw = served(request).gateway
        return await _model_call(gw, request, codec, model=model, stream=method == "streamGenerateContent")
    if method == "countTokens":
        return await _counted(request, codec, "countTokens", "totalTokens", model=model)
    return errors.error_response(
        codec,
        NotFound(f"unknown method {method!r}; expected generateContent or streamGenerateContent", field="path"),
    )


async def count_tokens(request: Request, route: Route) -> Response:
    """Anthropic's ``/v1/messages/count_tokens``."""
    return await _counted(request, route.protocol, "count_tokens", "input_tokens")


async def models(request: Request, route: Route) -> Response:
    gw = served(request).gateway
    return JSONResponse({"object": "list", "data": [{"id": gw.model_name, "object": "model", "owned_by": "polar"}]})


async def _model_call(
    gw: Gateway, request: Request, codec: ProtocolCodec, *, model: str | None = None, stream: bool | None = None
) -> Response:
    try:
        plan = await gw.calls.receive(_key(request, codec), _reader(gw, request), codec, model=model, stream=stream)
        every_s = gw.settings.keepalive_s
        if not plan.request.stream:
            call = asyncio.create_task(gw.calls.complete(plan))
            undelivered = partial(gw.calls.undelivered, plan)
            if every_s <= 0 or await keepalive.first_within(call, every_s):
                reply = await call
                return DeliveredJSON(reply, partial(undelivered, reply.capture_id))
            return StreamResponse(
                keepalive.padded_json(call, every_s, codec, undelivered), media_type="application/json"
            )
        opening = asyncio.create_task(gw.calls.open_stream(plan))
        if every_s <= 0 or await keepalive.first_within(opening, every_s):
            frames, release = await opening
            return StreamResponse(
                _frames_as_bytes(frames),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
                background=BackgroundTask(_run, release),
            )

        async def frames_of(opened: tuple[AsyncIterator[str], Any]) -> AsyncIterator[bytes]:
            frames, release = opened
            encoded = _frames_as_bytes(frames)
            try:
                async for frame in encoded:
                    yield frame
            finally:
                await aclose(encoded)
                release()

        return StreamResponse(
            keepalive.padded_stream(opening, every_s, frames_of, plan),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    except PolarError as exc:
        return errors.call_failed(codec, exc)
    except Exception:  # noqa: BLE001 -- the last resort: an unexpected error is the caller's shaped 500, logged
        return errors.call_crashed(codec)


async def _counted(
    request: Request, codec: ProtocolCodec, what: str, name: str, *, model: str | None = None
) -> Response:
    """``{name: n}``: how many prompt ids the body renders to; nothing is recorded."""
    gw = served(request).gateway
    try:
        n = await gw.calls.count_tokens(_key(request, codec), _reader(gw, request), codec, model=model)
    except PolarError as exc:
        return errors.error_response(codec, exc)
    except Exception:  # noqa: BLE001 -- the last resort: a shaped 500, logged
        return errors.internal_error(codec, what)
    return JSONResponse({name: n})


async def _frames_as_bytes(frames: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """The frames encoded; closing this closes ``frames`` (a stream cut at a yield records its partial reply)."""
    try:
        async for frame in frames:
            yield frame.encode()
    finally:
        await aclose(frames)


async def _run(fn: Callable[[], None]) -> None:
    """``fn()`` on the loop: a BackgroundTask runs a plain function in a worker thread (a thread hop per stream)."""
    fn()


def _key(request: Request, codec: ProtocolCodec) -> str | None:
    return api_key(request, query=codec.key_in_query)


def _reader(gw: Gateway, request: Request) -> Callable[[], Awaitable[bytes]]:
    """The body, read only when the call pipeline asks (once the caller's key was checked)."""
    return partial(read_body, request, gw.settings.max_body_bytes)
