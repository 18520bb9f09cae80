"""Per-call gateway cost over a long session whose calls alternate between two gateway replicas.

Two ``polar gateway`` processes share one Postgres store (a fresh schema, dropped at the end) and one instant
SGLang-wire backend (benchmarks/instant_backend.py: a tool call at once, so the gateway's own work is what is
timed). Each session is the agent conversation of benchmarks/gateway_support.py, growing by one tool round trip
per call (append mode), its calls sent to replica A, B, A, B, ...: every call lands on a replica that did not
write the previous capture, so it reads the captures it lacks (only those: the history is loaded incrementally)
before it builds the prompt. The same sessions on one replica are the baseline.

Printed: the median latency per call at turns 1, 2, 10, 25 and 50 over the sessions, for both patterns, and the
ratio of turn 50 to turn 1 (the goal: within 1.2x, i.e. per-call cost does not grow with the session).

    .venv/bin/python benchmarks/bench_replicas.py [--sessions 12] [--turns 50]

Postgres: POLAR_TEST_POSTGRES_URL (default the machine's server, database ``test``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import sqlalchemy as sa
from gateway_support import (
    ROOT,
    Server,
    chat_body,
    conversation,
    drop_schema,
    echo,
    free_port,
    gateway_env,
    post_json,
    schema_url,
    tool_turn,
)

sys.path.insert(0, str(ROOT))

from db.engine import make_engine
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings

POSTGRES_URL = os.environ.get("POLAR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CONTROL_TOKEN = "bench-" + secrets.token_urlsafe(16)
BIN = Path(sys.executable).parent
REPORT_TURNS = (1, 2, 10, 25, 50)


def start_servers(stack: ExitStack, tmp: Path, database_url: str) -> tuple[Server, Server]:
    cache = get_settings().cache_dir
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}

    def start(name: str, argv: list[str], env: dict[str, str], port: int, ready: str) -> Server:
        server = Server(name, argv, env={**base_env, **env}, log_dir=tmp, port=port, ready_path=ready)
        stack.callback(server.stop)
        return server

    port = free_port()
    upstream = start(
        "upstream", [sys.executable, "benchmarks/instant_backend.py", "--port", str(port)], {}, port, "/health"
    )
    upstream.wait_ready()
    replicas = []
    for name in ("replica-a", "replica-b"):
        port = free_port()
        env = gateway_env(tmp / name, cache, upstream.url, database_url, CONTROL_TOKEN, ensure_model_dir("tiny", cache))
        replicas.append(start(name, [str(BIN / "polar"), "gateway", "--port", str(port)], env, port, "/"))
    for replica in replicas:
        replica.wait_ready()
    return replicas[0], replicas[1]


async def session(client: httpx.AsyncClient, order: list[Server], turns: int) -> list[float]:
    """One session of ``turns`` calls, call i sent to ``order[i % len(order)]``; per-call latencies (s)."""
    reply = await client.post(
        order[0].url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}
    )
    reply.raise_for_status()
    key = reply.json()["api_key"]
    messages = conversation(0)
    latencies = []
    for turn in range(turns):
        body = json.dumps(chat_body(messages)).encode()
        gateway = order[turn % len(order)]
        started = time.perf_counter()
        reply = await post_json(client, gateway.url + "/v1/chat/completions", body, key)
        latencies.append(time.perf_counter() - started)
        if reply.status_code != 200:
            raise RuntimeError(f"{gateway.name}: HTTP {reply.status_code}: {reply.text[:300]}")
        messages = messages + tool_turn(turn, echo(reply.json()))
    return latencies


def medians(runs: list[list[float]], turns: int) -> list[float]:
    return [statistics.median(run[t] for run in runs) for t in range(turns)]


async def measure(a: Server, b: Server, sessions: int, turns: int) -> dict[str, list[float]]:
    async with httpx.AsyncClient(timeout=60) as client:
        await session(client, [a, b], 3)  # warm both replicas (imports, first queries, connection pools)
        alternating, one = [], []
        for _ in range(sessions):  # interleaved, so drift hits both patterns alike
            alternating.append(await session(client, [a, b], turns))
            one.append(await session(client, [a], turns))
    return {"alternating A/B": medians(alternating, turns), "one replica": medians(one, turns)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=50)
    args = parser.parse_args()
    wall = time.perf_counter()
    schema = f"polar_bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    with tempfile.TemporaryDirectory(prefix="polar-bench-") as tmp_name, ExitStack() as stack:
        with admin.begin() as db:
            db.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        stack.callback(admin.dispose)
        stack.callback(drop_schema, admin, schema)  # after the servers have stopped (LIFO)
        a, b = start_servers(stack, Path(tmp_name), schema_url(POSTGRES_URL, schema))
        print(
            f"two replicas (pids {a.pid}, {b.pid}) on one Postgres schema; {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.2f}; {args.sessions} sessions x {args.turns} calls per pattern"
        )
        results = asyncio.run(measure(a, b, args.sessions, args.turns))
    shown = [t for t in REPORT_TURNS if t <= args.turns]
    print("\nmedian per-call latency (ms) by turn")
    print(f"{'pattern':<18}" + "".join(f"{'turn ' + str(t):>10}" for t in shown) + f"{'last/1st':>10}")
    for name, per_turn in results.items():
        cells = "".join(f"{per_turn[t - 1] * 1e3:>10.2f}" for t in shown)
        print(f"{name:<18}{cells}{per_turn[-1] / per_turn[0]:>10.2f}")
    alternating = results["alternating A/B"]
    print(
        f"\nalternating replicas: turn {args.turns} / turn 1 = {alternating[-1] / alternating[0]:.2f}x, "
        f"turn {args.turns} / turn 2 = {alternating[-1] / alternating[1]:.2f}x (goal: within 1.2x)"
    )
    print(f"total {time.perf_counter() - wall:.0f} s; servers stopped, schema {schema} dropped")


if __name__ == "__main__":
    main()
