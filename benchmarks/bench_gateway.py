"""Gateway benchmark: what the gateway adds in front of a backend, what it keeps, what it stores.

One run starts every server it needs as a subprocess on loopback (stopped by process group at the end),
and prints five tables:

1. added latency (p50/p99 over the direct call) and requests/s against an instant backend
   (benchmarks/instant_backend.py), for Polar's gateway and the LiteLLM proxy forwarding to the same
   upstream process: Polar speaks SGLang's ``/generate`` to it (render, tokenize, parse, commit a capture
   to SQLite), LiteLLM its OpenAI ``/v1/chat/completions``; the client sends the same 20-message agent
   conversation (OpenAI chat, tools) from 1 and 16 concurrent connections;
2. time to first byte and first token, streaming, direct to the backend vs through the gateway: the
   instant backend at 20 ms per token, and ``polar serve-model`` (the tiny local model);
3. gateway memory per open session (RSS from /proc before and after 200 sessions of 5 calls each);
4. durable capture commits/s to Postgres under 1, 8 and 32 concurrent sessions, and how many commit
   transactions carried them (group commit: captures of one transaction share ``created_at = now()``);
5. stored bytes for one 100-turn session (SQLite and Postgres), next to the session's unique tokens and
   text and what storing every prompt whole would cost.

    scripts/litellm_env.sh                            # the LiteLLM proxy's own venv (run on demand too)
    .venv/bin/python benchmarks/bench_gateway.py [--quick] [--no-litellm] [--no-model]

Postgres: POLAR_TEST_POSTGRES_URL (default the machine's server, database ``test``); the run works in a
fresh schema and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from gateway_support import (  # beside this script
    LITELLM_VENV,
    ROOT,
    Server,
    chat_body,
    closed_loop,
    conversation,
    drop_schema,
    echo,
    free_port,
    gateway_env,
    litellm_command,
    percentile,
    post_json,
    schema_url,
    tool_turn,
)

from db import Capture
from db.engine import make_engine
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings
from polar.tokens.render import PromptBuilder
from polar.tokens.template import ChatTemplate
from polar.tokens.tokenizer import ChatTokenizer, load_tokenizer
from polar.wire import OPENAI_CHAT

POSTGRES_URL = os.environ.get("POLAR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CONTROL_TOKEN = "bench-" + secrets.token_urlsafe(16)  # the gateways' control token (control routes are closed)
BIN = Path(sys.executable).parent
LITELLM_KEY = f"sk-bench-{uuid.uuid4().hex}"  # LiteLLM refuses to start without a master key
TOKEN_DELAY_MS = 20
STREAM_MAX_TOKENS = 8
KIB = 1024


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


# ---- servers -------------------------------------------------------------------------------------------


def start_servers(stack: ExitStack, tmp: Path, args: argparse.Namespace, pg_url: str) -> dict[str, Server]:
    cache = get_settings().cache_dir
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "LITELLM_", "DATABASE_URL"))}
    servers: dict[str, Server] = {}

    def start(name: str, argv: list[str], env: dict[str, str], port: int, ready: str) -> Server:
        server = Server(name, argv, env={**base_env, **env}, log_dir=tmp, port=port, ready_path=ready)
        stack.callback(server.stop)
        servers[name] = server
        return server

    def gateway(name: str, backend_url: str, database_url: str) -> Server:
        port = free_port()
        # The instant backend names no model folder; serve-model names its own (kept for that gateway).
        folder = None if name == "polar-model" else ensure_model_dir("tiny", cache)
        env = gateway_env(tmp / name, cache, backend_url, database_url, CONTROL_TOKEN, folder)
        return start(name, [str(BIN / "polar"), "gateway", "--port", str(port)], env, port, "/")

    # The backends first: a gateway reads /model_info when it starts.
    port = free_port()
    upstream = start(
        "upstream",
        [sys.executable, "benchmarks/instant_backend.py", "--port", str(port)],
        {"POLAR_CACHE": str(cache)},
        port,
        "/health",
    )
    if not args.no_model:
        port = free_port()
        start(
            "model",
            [
                str(BIN / "polar"),
                "serve-model",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--cache-dir",
                str(cache),
            ],
            {},
            port,
            "/health",
        )
    if not args.no_litellm:
        argv, env, port = litellm_command(tmp, upstream.url, LITELLM_KEY)
        start("litellm", argv, env, port, "/health/liveliness")
    upstream.wait_ready()
    gateway("polar", upstream.url, f"sqlite:///{tmp / 'polar' / 'polar.db'}")
    gateway("polar-mem", upstream.url, f"sqlite:///{tmp / 'polar-mem' / 'polar.db'}")
    gateway("polar-pg", upstream.url, pg_url)
    if not args.no_model:
        servers["model"].wait_ready()
        gateway("polar-model", servers["model"].url, f"sqlite:///{tmp / 'polar-model' / 'polar.db'}")
    for server in servers.values():
        server.wait_ready()
    return servers


# ---- 1. added latency and throughput ---------------------------------------------------------------------


async def new_session(client: httpx.AsyncClient, gateway: Server) -> tuple[str, str]:
    reply = await client.post(
        gateway.url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}
    )
    reply.raise_for_status()
    data = reply.json()
    return data["session_id"], data["api_key"]


async def section_latency(
    client: httpx.AsyncClient, servers: dict[str, Server], levels: list[int], n_requests: int
) -> None:
    body = json.dumps(chat_body(conversation(9))).encode()
    keys = [(await new_session(client, servers["polar"]))[1] for _ in range(max(levels))]
    targets: list[tuple[str, str, list[str | None]]] = [
        ("direct", servers["upstream"].url + "/v1/chat/completions", [None] * max(levels)),
        ("polar", servers["polar"].url + "/v1/chat/completions", list(keys)),
    ]
    if "litellm" in servers:
        targets.append(("litellm", servers["litellm"].url + "/v1/chat/completions", [LITELLM_KEY] * max(levels)))

    def caller(url: str, worker_keys: list[str | None]):
        async def call(worker: int) -> None:
            reply = await post_json(client, url, body, worker_keys[worker])
            if reply.status_code != 200 or b"tool_calls" not in reply.content:
                raise RuntimeError(f"{url}: HTTP {reply.status_code}: {reply.text[:300]}")

        return call

    for _name, url, worker_keys in targets:  # warm-up: connections, lazy imports, caches
        await closed_loop(4, 40, caller(url, worker_keys))
    results: dict[tuple[str, int], tuple[list[float], float]] = {}
    for level in levels:
        for name, url, worker_keys in targets:
            results[name, level] = await closed_loop(
                level, n_requests * (2 if level > 1 else 1), caller(url, worker_keys)
            )

    print(
        f"\n== 1. added latency and throughput, instant backend ({len(json.loads(body)['messages'])}-message agent "
        f"conversation, {len(body) / KIB:.1f} KiB body, tool-call reply) =="
    )
    print(
        "Polar: one session per connection, the same request every call, so each call renders and tokenizes the whole\n"
        "conversation (no parent to append to), streams /generate and commits a capture to SQLite before answering"
    )
    print(
        f"{'target':<8} {'conc':>4} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} "
        f"{'added p99':>10} {'req/s':>8}"
    )
    summary: dict[tuple[str, int], tuple[float, float, float]] = {}
    for level in levels:
        base = results["direct", level][0]
        for name, _url, _keys in targets:
            lat, wall = results[name, level]
            p50, p99 = statistics.median(lat), percentile(lat, 99)
            added50, added99 = p50 - statistics.median(base), p99 - percentile(base, 99)
            summary[name, level] = (added50, added99, len(lat) / wall)
            added = ("-", "-") if name == "direct" else (ms(added50), ms(added99))
            print(
                f"{name:<8} {level:>4} {len(lat):>8} {ms(p50):>8} {ms(p99):>8} {added[0]:>10} {added[1]:>10} "
                f"{len(lat) / wall:>8.0f}"
            )
    if "litellm" in servers:
        for level in levels:
            (p50, p99, rps), (l50, l99, lrps) = summary["polar", level], summary["litellm", level]
            print(
                f"Polar/LiteLLM at conc {level}: added p50 {p50 / l50:.2f}x, added p99 {p99 / l99:.2f}x, req/s "
                f"{rps / lrps:.2f}x"
            )


# ---- 2. time to first byte, streaming --------------------------------------------------------------------


async def stream_times(
    client: httpx.AsyncClient, url: str, body: bytes, key: str | None, is_token
) -> tuple[float, float, float]:
    """Seconds to the first body byte, to the first event carrying a token, and to the end of the stream."""
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    started = time.perf_counter()
    first_byte = first_token = None
    async with client.stream("POST", url, content=body, headers=headers) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
        buffer = b""
        async for chunk in reply.aiter_raw():
            now = time.perf_counter() - started
            first_byte = now if first_byte is None else first_byte
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if first_token is None and line.startswith(b"data: {") and is_token(json.loads(line[6:])):
                    first_token = now
    if first_byte is None or first_token is None:
        raise RuntimeError(f"{url}: the stream carried no token")
    return first_byte, first_token, time.perf_counter() - started


def _generate_token(event: dict) -> bool:
    return bool(event.get("output_ids"))


def _chat_token(event: dict) -> bool:
    choices = event.get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


async def section_ttfb(client: httpx.AsyncClient, servers: dict[str, Server], tokenizer: ChatTokenizer, n: int) -> None:
    chat = chat_body(conversation(9), stream=True, max_tokens=STREAM_MAX_TOKENS)
    parsed = OPENAI_CHAT.parse_request(chat)
    prompt = PromptBuilder(tokenizer, ChatTemplate(get_settings().tool_format)).canonical_ids(
        parsed.messages, parsed.tools
    )
    direct_body = json.dumps(
        {
            "input_ids": list(prompt),
            "sampling_params": {"max_new_tokens": STREAM_MAX_TOKENS},
            "return_logprob": True,
            "stream": True,
        }
    ).encode()
    chat_bytes = json.dumps(chat).encode()
    rows = []
    await client.post(
        servers["upstream"].url + "/bench/config", json={"reply": "text", "stream_token_delay_ms": TOKEN_DELAY_MS}
    )
    try:
        pairs = [(f"instant, {TOKEN_DELAY_MS} ms/token", servers["upstream"], servers["polar"])]
        if "model" in servers:
            pairs.append(("tiny model (serve-model)", servers["model"], servers["polar-model"]))
        for label, backend, gateway in pairs:
            _, key = await new_session(client, gateway)
            paths = [
                ("direct /generate", backend.url + "/generate", direct_body, None, _generate_token),
                ("gateway chat", gateway.url + "/v1/chat/completions", chat_bytes, key, _chat_token),
            ]
            for _ in range(3):  # warm-up
                for _path, url, body, k, is_token in paths:
                    await stream_times(client, url, body, k, is_token)
            samples: dict[str, list[tuple[float, float, float]]] = {path: [] for path, *_ in paths}
            for _ in range(n):  # alternate, so drift hits both paths alike
                for path, url, body, k, is_token in paths:
                    samples[path].append(await stream_times(client, url, body, k, is_token))
            for path, *_ in paths:
                rows.append((label, path, *(statistics.median(s[i] for s in samples[path]) for i in range(3))))
    finally:
        await client.post(servers["upstream"].url + "/bench/config", json={"reply": "tool", "stream_token_delay_ms": 0})

    print(
        f"\n== 2. streaming: time to first byte / first token, direct vs through the gateway "
        f"({len(prompt)}-token prompt, {STREAM_MAX_TOKENS} tokens, p50 of {n}) =="
    )
    print(
        f"{'backend':<26} {'path':<17} {'first byte ms':>13} {'first token ms':>14} {'end ms':>8} "
        f"{'added (token) ms':>16}"
    )
    for i, (label, path, first_byte, first_token, end) in enumerate(rows):
        added = "-" if i % 2 == 0 else ms(first_token - rows[i - 1][3])
        print(f"{label:<26} {path:<17} {ms(first_byte):>13} {ms(first_token):>14} {ms(end):>8} {added:>16}")


# ---- agent sessions (sections 3-5) -----------------------------------------------------------------------


async def agent_session(client: httpx.AsyncClient, gateway: Server, key: str, calls: int) -> tuple[list[float], int]:
    """One growing conversation: each call echoes the reply and adds a tool result (append mode).
    Returns per-call latencies and the bytes of all request bodies sent."""
    messages = conversation(0)
    latencies, sent = [], 0
    for turn in range(calls):
        body = json.dumps(chat_body(messages)).encode()
        started = time.perf_counter()
        reply = await post_json(client, gateway.url + "/v1/chat/completions", body, key)
        latencies.append(time.perf_counter() - started)
        if reply.status_code != 200:
            raise RuntimeError(f"{gateway.name}: HTTP {reply.status_code}: {reply.text[:300]}")
        sent += len(body)
        messages = messages + tool_turn(turn, echo(reply.json()))
    return latencies, sent


async def run_sessions(
    client: httpx.AsyncClient, gateway: Server, sessions: list[tuple[str, str]], calls: int, concurrency: int
) -> tuple[list[float], float]:
    """``sessions`` run ``calls`` calls each, ``concurrency`` sessions at a time; latencies and wall time."""
    queue = list(sessions)
    latencies: list[float] = []

    async def worker() -> None:
        while queue:
            _sid, key = queue.pop()
            latencies.extend((await agent_session(client, gateway, key, calls))[0])

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


async def captures_of(client: httpx.AsyncClient, gateway: Server, session_id: str, key: str) -> list[dict[str, Any]]:
    reply = await client.get(
        f"{gateway.url}/v1/sessions/{session_id}/captures", headers={"authorization": f"Bearer {key}"}
    )
    reply.raise_for_status()
    return reply.json()["captures"]


# ---- 3. memory per open session --------------------------------------------------------------------------


async def section_memory(client: httpx.AsyncClient, gateway: Server, n_sessions: int, calls: int) -> None:
    await run_sessions(client, gateway, [await new_session(client, gateway) for _ in range(4)], calls, 4)  # warm-up
    await asyncio.sleep(0.5)
    before = gateway.rss_kib()
    sessions = [await new_session(client, gateway) for _ in range(n_sessions)]
    latencies, wall = await run_sessions(client, gateway, sessions, calls, 8)
    await asyncio.sleep(0.5)
    after = gateway.rss_kib()
    rows = await captures_of(client, gateway, *sessions[0])
    tokens = sum(r["n_prompt_delta"] + r["n_output"] for r in rows)
    per_session = (after - before) / n_sessions
    print(
        f"\n== 3. gateway memory per open session ({n_sessions} sessions x {calls} calls of a growing conversation, "
        f"append mode, 8 at a time; sessions left open) =="
    )
    print(
        f"{'RSS before MiB':>14} {'RSS after MiB':>14} {'per session KiB':>16} {'tokens/session':>15} "
        f"{'B/token':>8} {'calls/s':>8}"
    )
    print(
        f"{before / KIB:>14.1f} {after / KIB:>14.1f} {per_session:>16.1f} {tokens:>15} "
        f"{per_session * KIB / tokens:>8.0f} {len(latencies) / wall:>8.0f}"
    )


# ---- 4. durable capture commits/s to Postgres ------------------------------------------------------------


async def section_commits(
    client: httpx.AsyncClient, gateway: Server, admin: sa.Engine, levels: list[int], calls: int
) -> None:
    count = sa.text("SELECT count(*), count(DISTINCT created_at) FROM captures WHERE rollout_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    rows = []
    for level in levels:
        sessions = [await new_session(client, gateway) for _ in range(max(2 * level, 16))]
        latencies, wall = await run_sessions(client, gateway, sessions, calls, level)
        with admin.connect() as db:
            n_captures, n_commits = db.execute(count, {"ids": [sid for sid, _ in sessions]}).one()
        rows.append(
            (level, len(sessions), n_captures, wall, n_commits, statistics.median(latencies), percentile(latencies, 99))
        )
    print(
        f"\n== 4. durable capture commits to Postgres, concurrent sessions ({calls} calls each, growing conversation; "
        "commit transactions counted as distinct created_at = now() of the writer's transaction) =="
    )
    print(
        f"{'sessions at once':>16} {'sessions':>8} {'captures':>8} {'captures/s':>10} {'commits':>8} "
        f"{'captures/commit':>15} {'call p50 ms':>11} {'call p99 ms':>11}"
    )
    for level, n_sessions, n_captures, wall, n_commits, p50, p99 in rows:
        print(
            f"{level:>16} {n_sessions:>8} {n_captures:>8} {n_captures / wall:>10.0f} {n_commits:>8} "
            f"{n_captures / n_commits:>15.2f} {ms(p50):>11} {ms(p99):>11}"
        )


# ---- 5. stored bytes for one 100-turn session ------------------------------------------------------------

COLUMN_GROUPS = {
    "request_json (raw request)": ("request_json",),
    "response_json": ("response_json",),
    "token arrays (deltas, outputs, logprobs)": ("prompt_delta_ids", "output_ids", "output_logprobs"),
}


def _grouped(sizes: dict[str, int]) -> dict[str, int]:
    out = {group: sum(sizes[c] for c in cols) for group, cols in COLUMN_GROUPS.items()}
    grouped = {c for cols in COLUMN_GROUPS.values() for c in cols}
    out["other columns"] = sum(v for c, v in sizes.items() if c not in grouped)
    out["all columns"] = sum(sizes.values())
    return out


def sqlite_column_bytes(path: Path, session_id: str) -> dict[str, int]:
    columns = [c.name for c in Capture.__table__.columns]
    select = ", ".join(f"coalesce(sum(length(CAST({c} AS BLOB))), 0)" for c in columns)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        values = db.execute(f"SELECT {select} FROM captures WHERE rollout_id = ?", (session_id,)).fetchone()
    return _grouped(dict(zip(columns, values, strict=True)))


def postgres_column_bytes(admin: sa.Engine, session_id: str) -> dict[str, int]:
    columns = [c.name for c in Capture.__table__.columns]
    select = ", ".join(f"coalesce(sum(pg_column_size({c})), 0)" for c in columns)
    with admin.connect() as db:
        values = db.execute(
            sa.text(f"SELECT {select} FROM captures WHERE rollout_id = :sid"), {"sid": session_id}
        ).one()
    return _grouped({c: int(v) for c, v in zip(columns, values, strict=True)})


def relation_bytes(admin: sa.Engine) -> int:
    with admin.connect() as db:
        return int(db.execute(sa.text("SELECT pg_total_relation_size('captures')")).scalar_one())


async def hundred_turns(client: httpx.AsyncClient, gateway: Server, turns: int) -> dict[str, Any]:
    session_id, key = await new_session(client, gateway)
    latencies, sent = await agent_session(client, gateway, key, turns)
    return {
        "session_id": session_id,
        "captures": await captures_of(client, gateway, session_id, key),
        "latencies": latencies,
        "sent": sent,
    }


def session_tokens(captures: list[dict[str, Any]]) -> tuple[list[int], bool]:
    """The session's whole token sequence (last prompt + last output), rebuilt from the capture tree,
    and whether the captures form one chain."""
    sequences: dict[int, list[int]] = {}
    for row in captures:
        parent = sequences[row["parent_id"]] if row["parent_id"] is not None else []
        sequences[row["id"]] = parent[: row["prefix_len"]] + row["prompt_delta_ids"] + row["output_ids"]
    one_chain = all(
        r["parent_id"] == p["id"] and r["prefix_len"] == p["n_prompt"] + p["n_output"]
        for p, r in itertools.pairwise(captures)
    )
    return sequences[captures[-1]["id"]], one_chain


def section_storage(
    run_sqlite: dict[str, Any],
    sqlite_path: Path,
    run_pg: dict[str, Any],
    admin: sa.Engine,
    pg_table_bytes: int,
    tokenizer: ChatTokenizer,
) -> None:
    captures = run_pg["captures"]
    tokens, one_chain = session_tokens(captures)
    text_bytes = len(tokenizer.decode(tokens).encode())
    whole = sum(r["n_prompt"] for r in captures) * 4
    lite = sqlite_column_bytes(sqlite_path, run_sqlite["session_id"])
    pg = postgres_column_bytes(admin, run_pg["session_id"])
    turns = len(captures)
    print(
        f"\n== 5. stored bytes, one {turns}-turn session (append mode, each turn adds a tool call and a "
        f"{len(tool_turn(0)[1]['content'])}-character tool result; captures "
        f"{'in one chain' if one_chain else 'NOT in one chain'}) =="
    )
    print(f"{'captures table':<42} {'SQLite KiB':>11} {'Postgres KiB':>13}")
    for group in lite:
        print(f"{'  ' + group:<42} {lite[group] / KIB:>11.1f} {pg[group] / KIB:>13.1f}")
    print(f"{'  on disk: table + TOAST + indexes':<42} {'-':>11} {pg_table_bytes / KIB:>13.1f}")
    print(
        "  (Postgres compresses large values (TOAST); the instant backend's constant logprobs and the repetitive tool\n"
        "   results compress better than real ones would)"
    )
    print(f"{'reference':<42} {'KiB':>11}")
    print(f"{'  (a) unique tokens x 4 B (' + str(len(tokens)) + ' tokens)':<42} {len(tokens) * 4 / KIB:>11.1f}")
    print(f"{'  (b) unique text, UTF-8':<42} {text_bytes / KIB:>11.1f}")
    print(f"{'  (c) every prompt whole, sum n_prompt x 4 B':<42} {whole / KIB:>11.1f}")
    print(f"{'  request bodies as sent (JSON)':<42} {run_pg['sent'] / KIB:>11.1f}")
    for label, run in (("SQLite", run_sqlite), ("Postgres", run_pg)):
        lat = run["latencies"]
        print(
            f"call p50 on {label:<8}: turns 1-10 {ms(statistics.median(lat[:10]))} ms, turns {turns - 9}-{turns} "
            f"{ms(statistics.median(lat[-10:]))} ms"
        )


# ---- main ------------------------------------------------------------------------------------------------


async def run(
    servers: dict[str, Server], admin: sa.Engine, tmp: Path, args: argparse.Namespace, tokenizer: ChatTokenizer
) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        started = time.perf_counter()
        await section_latency(client, servers, [1, 16], 100 if args.quick else 300)
        await section_ttfb(client, servers, tokenizer, 8 if args.quick else 20)
        await section_memory(client, servers["polar-mem"], 50 if args.quick else 200, 5)
        empty_table = relation_bytes(admin)  # section 5 first: the Postgres schema is still empty
        turns = 30 if args.quick else 100
        run_pg = await hundred_turns(client, servers["polar-pg"], turns)
        pg_table_bytes = relation_bytes(admin) - empty_table
        await section_commits(client, servers["polar-pg"], admin, [1, 8, 32], 6)
        run_sqlite = await hundred_turns(client, servers["polar-mem"], turns)
        section_storage(run_sqlite, tmp / "polar-mem" / "polar.db", run_pg, admin, pg_table_bytes, tokenizer)
        print(f"\nmeasurements took {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and sessions (a smoke run)")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy")
    parser.add_argument("--no-model", action="store_true", help="skip the tiny-model row of the streaming table")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on SIGTERM too
    wall = time.perf_counter()
    if not args.no_litellm:
        subprocess.run(["bash", str(ROOT / "scripts" / "litellm_env.sh")], check=True, stdout=subprocess.DEVNULL)
    settings = get_settings()
    tokenizer = load_tokenizer("small", settings.cache_dir)
    schema = f"polar_bench_{uuid.uuid4().hex[:12]}"
    root_admin = make_engine(POSTGRES_URL)
    # The servers stop (ExitStack) before their folder goes (TemporaryDirectory).
    with tempfile.TemporaryDirectory(prefix="polar-bench-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        with root_admin.begin() as db:
            db.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        stack.callback(root_admin.dispose)
        stack.callback(drop_schema, root_admin, schema)  # after the servers have stopped (LIFO)
        admin = make_engine(schema_url(POSTGRES_URL, schema))
        stack.callback(admin.dispose)
        servers = start_servers(stack, tmp, args, schema_url(POSTGRES_URL, schema))
        print(
            f"servers up in {time.perf_counter() - wall:.0f} s: "
            + ", ".join(f"{s.name} (pid {s.pid})" for s in servers.values())
        )
        marker = LITELLM_VENV / ".polar-litellm-ready"
        litellm = marker.read_text().strip() if "litellm" in servers else "skipped"
        print(
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; {litellm}; "
            f"all clients share one httpx.AsyncClient in this process"
        )
        asyncio.run(run(servers, admin, tmp, args, tokenizer))
    print(f"total {time.perf_counter() - wall:.0f} s; servers stopped, schema {schema} dropped")


if __name__ == "__main__":
    main()
