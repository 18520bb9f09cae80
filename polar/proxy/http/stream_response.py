"""A streamed response whose client's departure is watched by one plain task.

Under an ASGI 2.3 server (uvicorn) a client that leaves is seen only through ``receive``, so Starlette's
``StreamingResponse`` runs each stream in an anyio task group with a second task listening for it: task group,
cancel scope, event and task handle per stream, about 4% of the gateway's samples at 1,000 streams (py-spy,
bench_gateway_scale section 3). ``StreamResponse`` does the same with one asyncio task that cancels the streaming
task when the client leaves; the body iterator then closes, and with it the backend's stream (the inference server
aborts the generation) and the call's in-flight slot; a stream cut that way leaves its partial reply on record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class StreamResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        if scope["type"] != "http" or streaming is None:
            await super().__call__(scope, receive, send)
            return
        left = False

        async def listen() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            streaming.cancel()  # only while the stream runs: it ends with this task cancelled, in one step

        listener = asyncio.create_task(listen())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left or streaming.uncancel() > 0:  # cancelled from elsewhere too: that stands
                raise
            # Cancelled in a send, the body was left at a yield: closed now, so a stream records its cut reply
            # (``polar.proxy.call.stream``) and a padded body its undelivered one, not when it is collected.
            await aclose(self.body_iterator)
        finally:
            listener.cancel()
        if self.background is not None:
            await self.background()


async def aclose(iterator: AsyncIterable[Any]) -> None:
    """Close an async generator left at a yield (its ``finally`` runs now, not when it is collected)."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()
