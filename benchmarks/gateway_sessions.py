"""Sections 3 to 5 of bench_gateway.py: agent sessions against a gateway, what it keeps and what it stores.

``new_session`` opens a session with the gateways' control token (``CONTROL_TOKEN``, which the script starts
them with); ``agent_session`` runs one growing conversation (each call echoes the reply and adds a tool
result), ``run_sessions`` many at a time, ``hundred_turns`` one long one with its captures. The sections print
table 3 (gateway memory per open session, RSS from /proc), table 4 (durable capture commits/s to Postgres and
the transactions that carried them) and table 5 (stored bytes of one session, SQLite and Postgres, next to its
unique tokens and text).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from gateway_support import KIB, Server, chat_body, conversation, echo, ms, percentile, post_json, tool_turn

from db import Capture
from polar.tokens.tokenizer import ChatTokenizer

CONTROL_TOKEN = "bench-" + secrets.token_urlsafe(16)  # the gateways' control token (control routes are closed)


# ---- agent sessions --------------------------------------------------------------------------------------


async def new_session(client: httpx.AsyncClient, gateway: Server) -> tuple[str, str]:
    reply = await client.post(
        gateway.url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}
    )
    reply.raise_for_status()
    data = reply.json()
    return data["session_id"], data["api_key"]


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
