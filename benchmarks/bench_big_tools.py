"""Do huge tool lists and tool descriptions hold other sessions? The isolation check of issue 32, timed.

    .venv/bin/python benchmarks/bench_big_tools.py [--rounds 5] [--tools 100000] [--description-mib 8]
    .venv/bin/python benchmarks/bench_big_tools.py --messages 200000 [--messages 800000 ...]

One live gateway (``polar gateway`` in a process of its own on a loopback port, so the clients here take none
of its CPU or its GIL; the tiny local model, SQLite in a temporary folder). Eight sessions
each make one small call per round in the four protocols, streamed and not (two tokens). The run is repeated
while one session sends an Anthropic body with ``--tools`` tools and another an OpenAI body whose one tool has a
``--description-mib`` MiB description, each in a loop; ``/health/live`` is polled every 20 ms throughout. Prints
the small calls' p50 / p99 latency in both runs and their ratio (measured in the same run), the worst and p99
``/health/live`` latency, and how long the big requests took to get their 400.

``--messages N`` instead sends, one at a time, an OpenAI Chat body and an Anthropic body of ``N`` one-character
messages (refused by the cost bound from the body's shape: each message costs the chat template's per-message
tokens) and prints, for each, the time to its 400 and the worst ``/health/live`` latency while it was handled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.bench_big_body import session
from benchmarks.gateway_support import Server, free_port
from polar.settings import get_settings
from tests.proxy.big_bodies import long_description_body, many_messages_body, many_tools_body
from tests.proxy.shapes import PROTOCOLS

KINDS = [(protocol, stream) for protocol in PROTOCOLS.values() for stream in (False, True)]


async def small_calls(client: httpx.AsyncClient, rounds: int) -> list[float]:
    keys = [await session(client) for _ in KINDS]
    latencies: list[float] = []

    async def one(index: int) -> None:
        protocol, stream = KINDS[index]
        for _ in range(rounds):
            started = time.perf_counter()
            reply = await client.post(
                protocol.url(stream), json=protocol.body(stream=stream), headers=protocol.headers(keys[index])
            )
            latencies.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text[:300]

    await asyncio.gather(*(one(i) for i in range(len(KINDS))))
    return latencies


async def big_calls(
    client: httpx.AsyncClient, path: str, raw: bytes, header: str, stop: asyncio.Event, took: list[float]
) -> None:
    key = await session(client)
    headers = {"content-type": "application/json", **({header: key} if header else {"Authorization": f"Bearer {key}"})}
    while not stop.is_set():
        started = time.perf_counter()
        reply = await client.post(path, content=raw, headers=headers)
        took.append(time.perf_counter() - started)
        assert reply.status_code == 400, reply.text[:300]


async def health(client: httpx.AsyncClient, stop: asyncio.Event, took: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        reply = await client.get("/health/live")
        took.append(time.perf_counter() - started)
        assert reply.status_code == 200
        await asyncio.sleep(0.02)


async def run(url: str, args: argparse.Namespace, bodies: tuple[bytes, bytes] | None) -> dict[str, list[float]]:
    took: dict[str, list[float]] = {"tools": [], "description": [], "health": []}
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(health(client, stop, took["health"]))]
        if bodies is not None:
            tasks.append(
                asyncio.create_task(big_calls(client, "/v1/messages", bodies[0], "x-api-key", stop, took["tools"]))
            )
            tasks.append(
                asyncio.create_task(big_calls(client, "/v1/chat/completions", bodies[1], "", stop, took["description"]))
            )
            await asyncio.sleep(0.5)  # the big bodies are in flight before the small calls start
        took["small"] = await small_calls(client, args.rounds)
        stop.set()
        await asyncio.gather(*tasks)
    return took


async def many_messages(url: str, count: int) -> None:
    """One many-message body per protocol, each timed to its 400 while ``/health/live`` is polled."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for name, path, raw, header in (
            ("openai_chat", "/v1/chat/completions", many_messages_body(count), ""),
            ("anthropic", "/v1/messages", many_messages_body(count), "x-api-key"),
        ):
            stop, probes, took = asyncio.Event(), [], []
            poller = asyncio.create_task(health(client, stop, probes))
            await asyncio.sleep(0.2)
            await big_calls_once(client, path, raw, header, took)
            stop.set()
            await poller
            print(
                f"{name:11s} {count} messages ({len(raw) / 1e6:.1f} MB): 400 in {took[0]:.2f} s; /health/live "
                f"{len(probes)} probes, max {max(probes) * 1000:.1f} ms"
            )


async def big_calls_once(client: httpx.AsyncClient, path: str, raw: bytes, header: str, took: list[float]) -> None:
    key = await session(client)
    headers = {"content-type": "application/json", **({header: key} if header else {"Authorization": f"Bearer {key}"})}
    started = time.perf_counter()
    reply = await client.post(path, content=raw, headers=headers)
    took.append(time.perf_counter() - started)
    assert reply.status_code == 400, reply.text[:300]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tools", type=int, default=100_000)
    parser.add_argument("--description-mib", type=float, default=8.0)
    parser.add_argument("--messages", type=int, action="append", help="many-message bodies of this many messages")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="polar-bench-tools-"))
    bodies = (many_tools_body(args.tools), long_description_body(int(args.description_mib * 1024 * 1024) - 1024))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env |= {
        "POLAR_HOME": str(home),
        "POLAR_CACHE": str(get_settings().cache_dir),
        "POLAR_CONTROL_TOKEN": "bench",
        "POLAR_DEFAULT_MAX_TOKENS": "2",
    }
    argv = [str(Path(sys.executable).parent / "polar"), "gateway", "--port", str(port)]
    if os.environ.get("BENCH_PROFILE_WRAPPER"):  # e.g. a script running the CLI under a profiler
        argv = [sys.executable, os.environ["BENCH_PROFILE_WRAPPER"], *argv[1:]]
    server = Server("gateway", argv, env=env, log_dir=home, port=port, ready_path="/health/live")
    try:
        server.wait_ready()
        if args.messages:
            for count in args.messages:
                asyncio.run(many_messages(server.url, count))
            return
        asyncio.run(run(server.url, args, None))  # warm-up
        baseline = asyncio.run(run(server.url, args, None))
        loaded = asyncio.run(run(server.url, args, bodies))
    finally:
        server.stop()
    b, lo = baseline["small"], loaded["small"]
    print(f"small calls: {len(b)} per run, {len(KINDS)} sessions (4 protocols, streamed and not)")
    print(f"baseline              p50 {pct(b, 0.5) * 1000:7.1f} ms  p99 {pct(b, 0.99) * 1000:7.1f} ms")
    print(f"with the big bodies   p50 {pct(lo, 0.5) * 1000:7.1f} ms  p99 {pct(lo, 0.99) * 1000:7.1f} ms")
    print(f"ratio loaded/baseline: p50 {pct(lo, 0.5) / pct(b, 0.5):.2f}x  p99 {pct(lo, 0.99) / pct(b, 0.99):.2f}x")
    for name in ("health",):
        for label, took in (("baseline", baseline[name]), ("loaded", loaded[name])):
            print(
                f"/health/live {label:8s}: {len(took)} probes, p99 {pct(took, 0.99) * 1000:6.1f} ms, "
                f"max {max(took) * 1000:6.1f} ms"
            )
    for name, size in (("tools", len(bodies[0])), ("description", len(bodies[1]))):
        took = loaded[name]
        print(
            f"{name:11s} body ({size / 1e6:.1f} MB): {len(took)} answered 400, median "
            f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
