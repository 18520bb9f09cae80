"""What an open agent session keeps on the gateway's Python heap (tracemalloc), for ``bench_agent_traffic.py``.

RSS, which the memory section prints too, counts the allocator's high-water mark from each cold start's transient
buffers (a 95k-token body decoded, rendered and sent) and moves with the order of allocations; the heap retained
per session, measured here with the gateway in this process (ASGI, no socket) in front of the same backend, is
what a session holds after its calls: its ids, its conversation and whatever a cache kept because of it.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

from benchmarks.gateway_support import gateway_env
from polar.models.tiny import ensure_model_dir
from polar.proxy.gateway import Gateway
from polar.proxy.http.app import create_app
from polar.settings import Settings, get_settings

CONTROL = "bench-heap"
# One session's traffic: given a client and a session key, it makes the session's calls and returns its tokens.
SessionCalls = Callable[[httpx.AsyncClient, str], Awaitable[int]]


async def heap_per_session(
    folder: Path, backend_url: str, sessions: int, calls: SessionCalls
) -> tuple[float, int, list[tuple[str, float]]]:
    """(retained bytes per session, tokens per session, the five largest sources as (file:line, bytes per
    session)) after ``sessions`` sessions made their ``calls``, one warm-up session before measuring."""
    cache = get_settings().cache_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env |= gateway_env(
        folder, cache, backend_url, f"sqlite:///{folder / 'heap.db'}", CONTROL, ensure_model_dir("tiny", cache)
    )
    with mock.patch.dict(os.environ, env, clear=True):
        settings = Settings()
    gateway = await Gateway.create(settings)
    transport = httpx.ASGITransport(app=create_app(gateway))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=600) as client:

            async def one() -> int:
                opened = await client.post("/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL}"})
                return await calls(client, opened.json()["api_key"])

            await one()  # imports, pools and first-call caches
            gc.collect()
            tracemalloc.start(1)
            before = tracemalloc.take_snapshot()
            tokens = sum([await one() for _ in range(sessions)])
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
    finally:
        await gateway.aclose()
    stats = after.compare_to(before, "lineno")
    total = sum(stat.size_diff for stat in stats)
    top: list[tuple[str, Any]] = []
    for stat in stats[:5]:
        frame = stat.traceback[0]
        top.append((f"{Path(frame.filename).name}:{frame.lineno}", stat.size_diff / sessions))
    return total / sessions, tokens // sessions, top
