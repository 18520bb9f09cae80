"""Gateway at fleet concurrency (issue 14): the hot path's cost, flat in the session, and its limits.

Starts the instant backend (benchmarks/instant_backend.py) and gateways on SQLite and Postgres as subprocesses
on loopback, and prints, each against a baseline measured in the same run:

1. append mode at concurrency 1, the 20-message agent call extended turn by turn: added p50 over the direct
   backend call, with the capture commit wait (the gateway's own histogram) printed apart; the per-call cost
   at turns 191-200 against turns 1-10, as added latency and as the gateway's own CPU time per call (its
   threads' run time: steadier than a difference of two latencies), and that CPU against turns 1-10 of a second
   session made between the last ten turns (the same process state and load: the length's own cost);
2. calls/s at concurrency 64 through one gateway process (SQLite, Postgres) against the direct backend and the
   LiteLLM proxy forwarding to the same backend (its venv, ``.venv-litellm``, is built by scripts/litellm_env.sh
   on first use; ``--no-litellm`` skips it): 64 agent sessions, each call extending its session's previous one
   (the steady state of a fleet), with the CPU each server process and the load generator spent per call, and
   what the machine's cores allow: the CPU per call left to a gateway serving half the direct rate, once the
   backend's and the load's are paid, and the calls/s of one gateway process at its measured CPU per call;
3. N streaming calls in flight at once (backend at 20 ms per token): errors, event-loop lag p50, p99 and worst
   during the streams (the gateway's histogram, as bucket bounds), every capture committed, memory per open
   session; three times: each session's first call, all N sent in the same instant (N connections accepted in
   one loop iteration; each call, holding earlier assistant turns no call here explains, reads the store for them
   and renders 20 messages whole); each session's next call (its first made before, as in a fleet mid-rollout),
   all sent at once; and the next calls sent over 0.5 s (each stream lasts longer than that, so all N are still
   in flight together: the peak is printed). A gateway behind on its streams reads several of a stream's
   cumulative chunks at once and decodes only the last, so the CPU per call moves with how far behind it is;

Sections 2 and 3 load the servers with aiohttp, whose client costs a fraction of a millisecond per call: httpx's
pool, at 64 calls in flight, spends about as much CPU per call as the gateway does and hid the servers' own
throughput behind its own (the direct backend measured at 190-390 calls/s through it, 4,400 through aiohttp).
4. the capture writer alone on Postgres (in this process): captures/s with group commit from 64 sessions (the
   median of three rounds), printed beside the disk's fsync latency and a one-row commit's; then, on SQLite and
   Postgres, its CPU per capture stored one at a time against a plain insert and commit of the same rows.

    .venv/bin/python benchmarks/bench_gateway_scale.py [--quick] [--no-litellm] [--only 1,2,3,4]

On a shared machine the numbers move with the other load; ratios in one run are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import httpx
import sqlalchemy as sa
from gateway_support import (
    LITELLM_VENV,
    Server,
    chat_body,
    closed_loop,
    conversation,
    echo,
    free_port,
    gateway_env,
    litellm_command,
    ms,
    percentile,
    schema_url,
)
from scale_streams import CONTROL, aio_post, scrape, section_in_flight, session_key
from writer_alone import section_commit_cost, section_writer

from db import make_engine, migrate
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings

POSTGRES_URL = os.environ.get("POLAR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
LITELLM_KEY = "sk-bench-" + secrets.token_urlsafe(12)  # LiteLLM refuses to start without a master key
BIN = Path(sys.executable).parent


def start(stack: ExitStack, tmp: Path, pg_url: str, litellm: bool) -> dict[str, Server]:
    cache = get_settings().cache_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    servers: dict[str, Server] = {}

    def server(name: str, argv: list[str], extra: dict[str, str], port: int, ready: str) -> Server:
        s = Server(name, argv, env={**env, **extra}, log_dir=tmp, port=port, ready_path=ready)
        stack.callback(s.stop)
        servers[name] = s
        return s

    port = free_port()
    upstream = server(
        "upstream", [sys.executable, "benchmarks/instant_backend.py", "--port", str(port)], {}, port, "/health"
    )
    upstream.wait_ready()
    for name, url in (("sqlite", f"sqlite:///{tmp / 'sqlite' / 'polar.db'}"), ("postgres", pg_url)):
        port = free_port()
        extra = {
            **gateway_env(tmp / name, cache, upstream.url, url, CONTROL, ensure_model_dir("tiny", cache)),
            "POLAR_BACKEND_MAX_IN_FLIGHT": "2048",
        }
        server(name, [str(BIN / "polar"), "gateway", "--port", str(port)], extra, port, "/")
    if litellm:
        argv, extra, port = litellm_command(tmp, upstream.url, LITELLM_KEY)
        server("litellm", argv, extra, port, "/health/liveliness")
    for s in servers.values():
        s.wait_ready()
    return servers


async def post(client: httpx.AsyncClient, url: str, body: dict, key: str | None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = await client.post(url, json=body, headers=headers)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {reply.status_code}: {reply.text[:300]}")
    return reply.json()


# ---- 1. append mode, concurrency 1 -----------------------------------------------------------------------


async def turn_of(
    client: httpx.AsyncClient, gateway: Server, direct_url: str, messages: list, key: str, turn: int
) -> tuple[list, float, float]:
    """One agent turn, direct then through ``gateway``: (the next messages, added seconds, the gateway's CPU s)."""
    body = chat_body(messages, max_tokens=64)
    t0 = time.perf_counter()
    await post(client, direct_url, body, None)
    t1, ran = time.perf_counter(), gateway.run_s()
    reply = await post(client, gateway.url + "/v1/chat/completions", body, key)
    t2 = time.perf_counter()
    said = echo(reply)  # a short tool result: 200 turns stay inside the context window
    result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": f"ok {turn}"}
    return [*messages, said, result], (t2 - t1) - (t1 - t0), gateway.run_s() - ran


async def section_append(client: httpx.AsyncClient, servers: dict[str, Server], turns: int) -> None:
    print(f"\n== 1. append mode, concurrency 1: one agent session of {turns} turns (starts at 20 messages) ==")
    print(
        f"{'store':<9} {'added p50 ms':>12} {'commit wait p50-ish ms':>22} {'turns 1-10 ms':>14} "
        f"{'last 10 ms':>11} {'last/first':>10} {'gateway CPU ms, turns 1-10':>26} {'last 10':>8} {'last/first':>10} "
        f"{'beside: 1-10':>14} {'last/beside':>10}"
    )
    print(
        "(beside: turns 1-10 of a second session made between the long session's last ten turns, so both see the\n"
        " same process state and machine load; last/beside is the cost of the session's length alone)"
    )
    direct_url = servers["upstream"].url + "/v1/chat/completions"
    for store in ("sqlite", "postgres"):
        gateway = servers[store]
        key, beside_key = await session_key(client, gateway), await session_key(client, gateway)
        messages, beside = conversation(9), conversation(9)
        added: list[float] = []
        cpu: list[float] = []  # the gateway's own CPU time per call (its threads' run time, to the ns)
        cpu_beside: list[float] = []  # a second session's first turns, made between the long one's last turns

        before = await scrape(client, gateway)
        for turn in range(turns):
            if turn >= turns - 11:  # the same process state and machine load as the last turns: drift cancels
                beside, _, spent = await turn_of(client, gateway, direct_url, beside, beside_key, turn)
                cpu_beside.append(spent)
            messages, extra, spent = await turn_of(client, gateway, direct_url, messages, key, turn)
            added.append(extra)
            cpu.append(spent)
        after = await scrape(client, gateway)
        wait_sum = (
            after[("polar_capture_commit_wait_seconds_sum", ())] - before[("polar_capture_commit_wait_seconds_sum", ())]
        )
        wait_n = (
            after[("polar_capture_commit_wait_seconds_count", ())]
            - before[("polar_capture_commit_wait_seconds_count", ())]
        )
        first, last = statistics.median(added[1:11]), statistics.median(added[-10:])
        cpu_first, cpu_last = statistics.median(cpu[1:11]), statistics.median(cpu[-10:])
        cpu_fresh = statistics.median(cpu_beside[1:])
        print(
            f"{store:<9} {ms(statistics.median(added)):>12} {ms(wait_sum / max(wait_n, 1)) + ' (mean)':>22} "
            f"{ms(first):>14} {ms(last):>11} {last / first:>10.2f} {ms(cpu_first):>26} {ms(cpu_last):>8} "
            f"{cpu_last / cpu_first:>10.2f} {ms(cpu_fresh):>14} {cpu_last / cpu_fresh:>10.2f}"
        )


# ---- 2. calls/s at concurrency 64 ------------------------------------------------------------------------


async def section_throughput(client: httpx.AsyncClient, servers: dict[str, Server], n: int, conc: int) -> None:
    print(
        f"\n== 2. calls/s at concurrency {conc}: {conc} agent sessions, each call extending the session's previous "
        "one (starts at 20 messages; aiohttp load) =="
    )
    rows = []
    for name in ("direct", "sqlite", "postgres", "litellm"):
        if name not in servers and name != "direct":
            continue
        target = servers["upstream" if name == "direct" else name]
        url = target.url + "/v1/chat/completions"
        if name in ("sqlite", "postgres"):
            keys: list[str | None] = [await session_key(client, target) for _ in range(conc)]
        else:
            keys = [LITELLM_KEY if name == "litellm" else None] * conc
        conversations = [conversation(9) for _ in range(conc)]
        failures: list[str] = []

        async def call(worker: int, url=url, keys=keys, conversations=conversations, failures=failures) -> None:
            messages = conversations[worker]
            try:
                said = echo(await aio_post(http, url, chat_body(messages, max_tokens=64), keys[worker]))
            except (RuntimeError, aiohttp.ClientError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": "ok"}
            conversations[worker] = [*messages, said, result]

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await closed_loop(conc, conc * 2, call)  # warm-up: every session's first call
            failures.clear()
            before = {s: servers[s].cpu_s() for s in {"upstream", name} - {"direct"}}
            load_before = time.process_time()
            lat, wall = await closed_loop(conc, n, call)
            used = {s: (servers[s].cpu_s() - t) * 1000 / len(lat) for s, t in before.items()}
            used["load"] = (time.process_time() - load_before) * 1000 / len(lat)
        rows.append((name, len(lat) / wall, statistics.median(lat), percentile(lat, 99), failures, used))
    direct = rows[0][1]
    print(
        f"{'target':<9} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'vs direct':>9} {'errors':>6} "
        f"{'its CPU ms/call':>15} {'backend CPU ms/call':>19} {'load CPU ms/call':>16}"
    )
    for name, rps, p50, p99, failures, used in rows:
        own = f"{used[name]:.2f}" if name in used else "-"
        print(
            f"{name:<9} {rps:>8.0f} {ms(p50):>8} {ms(p99):>8} {rps / direct:>9.2f} {len(failures):>6} "
            f"{own:>15} {used['upstream']:>19.2f} {used['load']:>16.2f}"
        )
        if failures:
            print(f"          first error: {failures[0]}")
    print_ceilings(rows, direct)
    by_name = {name: rps for name, rps, *_ in rows}
    if "litellm" in by_name:
        print(
            f"Polar / LiteLLM calls/s: SQLite {by_name['sqlite'] / by_name['litellm']:.2f}x, "
            f"Postgres {by_name['postgres'] / by_name['litellm']:.2f}x (LiteLLM stores nothing)"
        )


def print_ceilings(rows: list, direct: float) -> None:
    """What this machine's cores allow a gateway: the backend and the load generator share them with it, and the
    backend does more for a gateway's call (token ids in, ids and logprobs out) than for a direct one. Printed:
    the CPU per call a gateway may spend at most to serve half the direct rate here, and what one process serves
    at most at its measured CPU per call (one loop: one core at most)."""
    cores = os.cpu_count() or 1
    half = direct / 2
    for name, rps, *_, used in rows:
        if name not in ("sqlite", "postgres"):
            continue
        others = used["upstream"] + used["load"]  # ms of CPU per call outside the gateway
        budget = min(cores * 1000 / half - others, 1000 / half)
        allowed = f"at most {budget:.2f} ms" if budget > 0 else "nothing: those two alone fill the cores"
        bound = min(1000 / used[name], cores * 1000 / (others + used[name]))
        print(
            f"{name}: half of direct is {half:.0f} calls/s; the backend and the load take {others:.2f} ms of CPU a "
            f"call, leaving a gateway {allowed} (this one spends {used[name]:.2f} ms, at which one process serves "
            f"at most {bound:.0f} calls/s: {rps / bound:.0%} of that reached)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--writer-only", action="store_true", help="only section 4 (no servers): --only 4")
    parser.add_argument("--only", default="1,2,3,4", help="the sections to run, comma-separated (default all)")
    parser.add_argument("--turns", type=int, help="section 1's session length (default 200; --quick 30)")
    parser.add_argument("--calls", type=int, help="section 2's calls per target (default 2000; --quick 300)")
    parser.add_argument("--in-flight", type=int, help="section 3's streams at once (default 1000; --quick 200)")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy in section 2")
    args = parser.parse_args()
    only = {"4"} if args.writer_only else set(args.only.split(","))
    if "2" not in only:
        args.no_litellm = True
    if not args.no_litellm:
        subprocess.run(
            ["bash", str(LITELLM_VENV.parent / "scripts" / "litellm_env.sh")], check=True, stdout=subprocess.DEVNULL
        )
    turns, calls, in_flight, writes = (30, 300, 200, 3000) if args.quick else (200, 2000, 1000, 20000)
    turns, calls, in_flight = args.turns or turns, args.calls or calls, args.in_flight or in_flight
    print(
        f"bench_gateway_scale on {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f}: a shared machine moves these)"
    )
    schema = "bench_scale_" + secrets.token_hex(4)
    admin = make_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    pg_url = schema_url(POSTGRES_URL, schema)
    try:
        migrate.upgrade(pg_url)
        if only & {"1", "2", "3"}:
            with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
                servers = start(stack, Path(tmp), pg_url, litellm=not args.no_litellm)

                async def run() -> None:
                    limits = httpx.Limits(max_connections=in_flight + 64, max_keepalive_connections=in_flight + 64)
                    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                        if "1" in only:
                            await section_append(client, servers, turns)
                        if "2" in only:
                            await section_throughput(client, servers, calls, 64)
                        for ramp_s, next_calls in ((0.0, False), (0.0, True), (0.5, True)) if "3" in only else ():
                            await section_in_flight(client, servers, in_flight, ramp_s, next_calls)

                asyncio.run(run())
        if "4" in only:
            section_writer(pg_url, writes, 64)
            with tempfile.TemporaryDirectory() as tmp:
                sqlite_url = f"sqlite:///{tmp}/writer.db"
                migrate.upgrade(sqlite_url)
                section_commit_cost({"SQLite": sqlite_url, "Postgres": pg_url}, writes // 10)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
