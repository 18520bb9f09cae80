"""What one open session costs the gateway process in memory, measured on the Python heap (tracemalloc).

``bench_gateway_scale.py`` section 3 prints the RSS growth over 1,000 streams in flight at once, which counts the
calls' transient buffers as well (the allocator keeps its high-water mark). This benchmark measures what stays:
the gateway runs in this process (ASGI, no socket) against the SGLang-wire instant backend, opens ``--sessions``
sessions, runs an agent loop of ``--calls`` calls in each (from a 20-message conversation), and prints the heap
retained per open session, the largest sources by line, and the RSS growth beside it.

Usage: ``.venv/bin/python benchmarks/bench_session_memory.py [--sessions 500] [--calls 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import sys
import tempfile
import tracemalloc
from pathlib import Path
from unittest import mock

import httpx
from gateway_support import Server, chat_body, conversation, echo, free_port, gateway_env, tool_turn

from polar.models.tiny import ensure_model_dir
from polar.proxy.gateway import Gateway
from polar.proxy.http.app import create_app
from polar.settings import Settings, get_settings

CONTROL = {"Authorization": "Bearer bench-memory"}


def rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() // 1024


async def measure(settings: Settings, sessions: int, calls: int) -> None:
    gw = await Gateway.create(settings)
    transport = httpx.ASGITransport(app=create_app(gw))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=120) as client:

            async def session() -> None:
                opened = await client.post("/v1/sessions", json={}, headers=CONTROL)
                key = opened.json()["api_key"]
                messages = conversation(9)
                for turn in range(calls):  # an agent loop: each call re-sends the history plus its tool result
                    reply = await client.post(
                        "/v1/chat/completions",
                        json=chat_body(messages),
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    if reply.status_code != 200:
                        raise RuntimeError(f"call failed: {reply.status_code} {reply.text[:200]}")
                    messages += tool_turn(9 + turn, echo(reply.json()))

            await asyncio.gather(*(session() for _ in range(20)))  # warm-up: imports, pools, caches
            gc.collect()
            tracemalloc.start(1)
            before, rss_before = tracemalloc.take_snapshot(), rss_kib()
            for start in range(0, sessions, 100):
                await asyncio.gather(*(session() for _ in range(min(100, sessions - start))))
            gc.collect()
            after, rss_after = tracemalloc.take_snapshot(), rss_kib()
            tracemalloc.stop()
    finally:
        await gw.aclose()
    stats = after.compare_to(before, "lineno")
    total = sum(stat.size_diff for stat in stats)
    print(f"== {sessions} open sessions, an agent loop of {calls} calls each (from 20 messages, a tool call each) ==")
    print(f"Python heap retained per open session: {total / sessions / 1024:.1f} KiB (goal <= 32 KiB)")
    print(f"RSS growth per session: {(rss_after - rss_before) / sessions:.1f} KiB (allocator high-water included)")
    print("largest sources (KiB per session):")
    for stat in stats[:8]:
        frame = stat.traceback[0]
        print(f"  {stat.size_diff / sessions / 1024:6.2f}  {Path(frame.filename).name}:{frame.lineno}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    cache = get_settings().cache_dir
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        upstream = Server(
            "upstream",
            [sys.executable, "benchmarks/instant_backend.py", "--port", str(port)],
            env=dict(os.environ),
            log_dir=Path(tmp),
            port=port,
            ready_path="/health",
        )
        try:
            upstream.wait_ready()
            env = gateway_env(
                Path(tmp),
                cache,
                upstream.url,
                f"sqlite:///{tmp}/polar.db",
                "bench-memory",
                ensure_model_dir("tiny", cache),
            )
            with mock.patch.dict(os.environ, env):
                settings = Settings()
            asyncio.run(measure(settings, args.sessions, args.calls))
        finally:
            upstream.stop()


if __name__ == "__main__":
    main()
