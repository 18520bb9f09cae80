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

Tables 1-2 are printed by gateway_forwarding.py, 3-5 by gateway_sessions.py (beside this script); this script
starts the servers and runs the sections in order.

    scripts/litellm_env.sh                            # the LiteLLM proxy's own venv (run on demand too)
    .venv/bin/python benchmarks/bench_gateway.py [--quick] [--no-litellm] [--no-model]

Postgres: POLAR_TEST_POSTGRES_URL (default the machine's server, database ``test``); the run works in a
fresh schema and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import sqlalchemy as sa
from gateway_forwarding import LITELLM_KEY, section_latency, section_ttfb  # the gateway_* modules: beside this script
from gateway_sessions import (
    CONTROL_TOKEN,
    hundred_turns,
    relation_bytes,
    section_commits,
    section_memory,
    section_storage,
)
from gateway_support import (
    LITELLM_VENV,
    ROOT,
    Server,
    drop_schema,
    free_port,
    gateway_env,
    litellm_command,
    schema_url,
)

from db.engine import make_engine
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings
from polar.tokens.tokenizer import ChatTokenizer, load_tokenizer

POSTGRES_URL = os.environ.get("POLAR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BIN = Path(sys.executable).parent


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
