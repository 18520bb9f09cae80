"""The backend HTTP client: the gateway's own (``polar.backends.http1``) against aiohttp and httpx.

Starts the instant backend (benchmarks/instant_backend.py) and sends its native ``/generate`` the body the
gateway sends (a few thousand prompt ids, serialised by orjson), streamed as the gateway reads it or not, at
concurrency 1 and 64, from one process. Prints calls/s and this process's CPU time per call (what the client
costs the gateway's event loop), each client against the others in the same run.

    .venv/bin/python benchmarks/bench_backend_client.py [--calls N] [--ids N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
from gateway_support import Server, free_port

from polar.backends import http1

HEADERS = {"content-type": "application/json"}


async def _httpx_run(url: str, body: bytes, calls: int, conc: int, stream: bool) -> None:
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one() -> None:
            if stream:
                async with client.stream("POST", url, content=body, headers=HEADERS) as reply:
                    async for _line in reply.aiter_lines():
                        pass
            else:
                reply = await client.post(url, content=body, headers=HEADERS)
                orjson.loads(reply.content)

        await _closed_loop(one, calls, conc)


async def _aiohttp_run(url: str, body: bytes, calls: int, conc: int, stream: bool) -> None:
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def one() -> None:
            async with client.post(url, data=body, headers=HEADERS) as reply:
                if stream:
                    async for _line in reply.content:
                        pass
                else:
                    orjson.loads(await reply.read())

        await _closed_loop(one, calls, conc)


async def _polar_run(url: str, body: bytes, calls: int, conc: int, stream: bool) -> None:
    """The gateway's own client (``polar.backends.http1``)."""
    client = http1.Client(60)

    async def one() -> None:
        async with client.post(url, body) as reply:
            if stream:
                async for _lines in reply.aiter_line_batches():
                    pass
            else:
                await reply.aread()
                orjson.loads(reply.content)

    try:
        await _closed_loop(one, calls, conc)
    finally:
        await client.aclose()


async def _closed_loop(one, calls: int, conc: int) -> None:
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    await asyncio.gather(*(worker() for _ in range(conc)))


def measure(run, url: str, body: bytes, calls: int, conc: int, stream: bool) -> tuple[float, float]:
    asyncio.run(run(url, body, min(calls, 50), conc, stream))  # warm-up
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(run(url, body, calls, conc, stream))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return calls / wall, cpu / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--ids", type=int, default=3700, help="prompt ids per call (the 20-message agent call)")
    args = parser.parse_args()
    clients = {"httpx": _httpx_run, "aiohttp": _aiohttp_run, "polar": _polar_run}
    print(f"bench_backend_client on {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        argv = [sys.executable, "benchmarks/instant_backend.py", "--port", str(port)]
        upstream = Server("upstream", argv, env=dict(os.environ), log_dir=Path(tmp), port=port, ready_path="/health")
        try:
            upstream.wait_ready()
            url = upstream.url + "/generate"
            print(f"{'client':<8} {'stream':>6} {'conc':>4} {'calls/s':>8} {'CPU us/call':>11}")
            for stream in (False, True):
                for conc in (1, 64):
                    body = orjson.dumps(
                        {
                            "input_ids": list(range(args.ids)),
                            "sampling_params": {"max_new_tokens": 64},
                            "return_logprob": True,
                            "stream": stream,
                        }
                    )
                    for name, run in clients.items():
                        rps, cpu = measure(run, url, body, args.calls, conc, stream)
                        print(f"{name:<8} {stream!s:>6} {conc:>4} {rps:>8.0f} {cpu * 1e6:>11.0f}")
        finally:
            upstream.stop()


if __name__ == "__main__":
    main()
