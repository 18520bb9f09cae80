"""Do large request bodies delay other sessions? Small-call latency with and without 10 MB bodies in flight.

    .venv/bin/python benchmarks/bench_big_body.py [--clients 4] [--calls 20] [--big-mb 10] [--big-senders 1]

One live gateway (uvicorn on a loopback port, the tiny local model, SQLite in a temporary folder). ``--clients``
sessions each make ``--calls`` small chat calls (two tokens) back to back; the run is repeated while
``--big-senders`` other sessions send bodies of ``--big-mb`` MB (ten messages of 1 MB text each: decoding,
checking and tokenizing them is the work) in a loop. Prints p50 / p95 / max latency of the small calls in both
runs and the ratio loaded / baseline measured in the same run, plus how long each big body took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import uvicorn

from polar.proxy.gateway import Gateway
from polar.proxy.http.app import create_app
from polar.settings import Settings
from tests.proxy.gateway_server import free_port


def serve(settings: Settings, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    holder: dict[str, uvicorn.Server] = {}

    async def main() -> None:
        gateway = await Gateway.create(settings)
        config = uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="warning")
        holder["server"] = uvicorn.Server(config)
        await holder["server"].serve()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=1).status_code == 200:
                return holder["server"], thread
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("gateway did not start")


async def session(client: httpx.AsyncClient) -> str:
    reply = await client.post("/v1/sessions", json={}, headers={"Authorization": "Bearer bench"})
    reply.raise_for_status()
    return reply.json()["api_key"]


async def small_calls(client: httpx.AsyncClient, calls: int) -> list[float]:
    key = await session(client)
    latencies = []
    for i in range(calls):
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {i}"}]}
        started = time.perf_counter()
        reply = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        latencies.append(time.perf_counter() - started)
        assert reply.status_code == 200, reply.text
    return latencies


async def big_calls(client: httpx.AsyncClient, megabytes: int, stop: asyncio.Event, took: list[float]) -> None:
    key = await session(client)
    text = ("lorem ipsum dolor sit amet " * 40_000)[: 1024 * 1024]
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": text}] * megabytes}
    raw = json.dumps(body).encode()  # once: the client's own JSON encoding is not what is measured
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    while not stop.is_set():
        started = time.perf_counter()
        reply = await client.post("/v1/chat/completions", content=raw, headers=headers)
        took.append(time.perf_counter() - started)
        assert reply.status_code < 500, reply.text  # too long for the context window: a 400 after tokenizing


def summary(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))], ordered[-1]


async def run(url: str, args: argparse.Namespace, big: bool) -> tuple[list[float], list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        stop, took = asyncio.Event(), list[float]()
        senders = [
            asyncio.create_task(big_calls(client, args.big_mb, stop, took))
            for _ in range(args.big_senders if big else 0)
        ]
        if senders:
            await asyncio.sleep(1.0)  # the big bodies are in flight before the small calls start
        results = await asyncio.gather(*(small_calls(client, args.calls) for _ in range(args.clients)))
        stop.set()
        await asyncio.gather(*senders)
        return [x for r in results for x in r], took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--big-mb", type=int, default=10)
    parser.add_argument("--big-senders", type=int, default=1)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="polar-bench-big-"))
    settings = Settings(home=home, control_token="bench", default_max_tokens=2)
    port = free_port()
    server, thread = serve(settings, port)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(run(url, args, big=False))  # warm-up
        baseline, _ = asyncio.run(run(url, args, big=False))
        loaded, took = asyncio.run(run(url, args, big=True))
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    b, lo = summary(baseline), summary(loaded)
    print(f"small calls: {len(baseline)} per run, {args.clients} sessions")
    print(f"baseline   p50 {b[0] * 1000:7.1f} ms  p95 {b[1] * 1000:7.1f} ms  max {b[2] * 1000:7.1f} ms")
    print(
        f"with {args.big_mb} MB bodies  p50 {lo[0] * 1000:7.1f} ms  p95 {lo[1] * 1000:7.1f} ms"
        f"  max {lo[2] * 1000:7.1f} ms"
    )
    print(f"ratio loaded/baseline: p50 {lo[0] / b[0]:.2f}x  p95 {lo[1] / b[1]:.2f}x  max {lo[2] / b[2]:.2f}x")
    if took:
        print(f"big bodies: {len(took)} answered, {statistics.median(took):.2f} s median each")


if __name__ == "__main__":
    main()
