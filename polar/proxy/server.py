"""``polar gateway``: run the gateway with uvicorn on the configured backend and store.

``--workers N`` runs N gateway processes on one port (``SO_REUSEPORT``: the kernel spreads new connections over
them). A session's calls may reach any of them: seq numbers come from the store's per-session counter and each
process extends its history from the store when it lacks a call (``polar.proxy.session.history``). The parent migrates
the store and settles the control token once, then starts the workers and stops them when it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import uvicorn

from db import migrate
from db.engine import describe_database, normalize_url
from polar.auth import control_token, where
from polar.httpserve.header_timeout import with_header_timeout
from polar.proxy.gateway import Gateway
from polar.proxy.http.app import create_app
from polar.proxy.registration import registered, watch_drain
from polar.settings import Settings


def _shared_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def tune_runtime() -> None:
    """The interpreter's collector and thread switching, set for a gateway holding a thousand calls in flight (each
    measured with bench_gateway_scale section 3, 1,000 streams, 2 cores):

    - What start-up made (the tokenizer's vocabulary, the chat format, modules) lives as long as the process: frozen
      out of the collector's sight, a full collection walks only what calls made since. Full collections paused the
      loop 0.3-0.4 s before; with a thousand calls in flight one still walks their objects for 0.1-0.2 s, so it
      runs once per 1,000 middle collections (and only when the old objects have grown by a quarter, CPython's own
      rule): cycles that outlive the young collections are rare here (a full collection found 30-5,000).
    - Young and middle collections are kept small, not rare: a collection's pause is the objects it walks, and with
      calls ending all the time the young count (allocations less every freed object, old ones too) lets the young
      list grow to ten times its threshold. At (50,000, 20) a young collection paused the loop 20-70 ms and a middle
      one, walking twenty young collections' survivors, 0.3-0.45 s (the worst lag of section 3's third run); at
      (5,000, 5) they take 20-45 ms and the worst lag is 100 ms, with the same CPU per call at 64 in flight.
    - Threads (the capture writer, store reads, long renders) hand the interpreter back every 1 ms, not 5: the
      loop waits for it after each socket write it makes while they run, and a hundred writes held it 0.25-0.5 s.
    - The tokenizer encodes in the thread that calls it (``TOKENIZERS_PARALLELISM=false`` unless set): its thread
      pool would spread a long render over every core, and on a small host the event loop then waits for a core
      (bench_agent_traffic's isolation section); each render runs in one thread, and other sessions' calls keep one.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    gc.collect()
    gc.freeze()
    gc.set_threshold(5_000, 5, 1000)
    sys.setswitchinterval(0.001)


def uvicorn_config(app: Any, settings: Settings, **where: Any) -> uvicorn.Config:
    """The gateway's HTTP server: quiet, five seconds to finish calls at shutdown, idle connections kept
    ``connection_idle_s`` (uvicorn's 5 s default equals httpx's pool expiry: a call sent as the gateway closed its
    connection failed with a read error at 96 agent sessions), and connections without whole request headers within
    ``header_timeout_s`` closed (``polar.httpserve.header_timeout``: uvicorn itself never times out unfinished
    headers)."""
    return uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=settings.connection_idle_s,
        http=with_header_timeout(settings.header_timeout_s),
        **where,
    )


async def serve_gateway(settings: Settings, host: str, port: int, *, reuse_port: bool = False) -> None:
    gateway = await Gateway.create(settings)
    tune_runtime()
    config = uvicorn_config(create_app(gateway), settings, host=host, port=port)
    print(
        f"polar gateway on http://{host}:{port} (backend={gateway.backend.name}, "
        f"store: {describe_database(normalize_url(settings.resolved_database_url))}); "
        f"control routes need the token from {where(settings)}",
        flush=True,
    )
    server = uvicorn.Server(config)
    async with registered(gateway.factory, settings, host, port) as gateway_id:  # the control API pushes weights
        drain = asyncio.create_task(watch_drain(gateway.factory, gateway_id, lambda: server.should_exit))
        try:
            if reuse_port:
                sock = _shared_socket(host, port)
                try:
                    await server.serve(sockets=[sock])
                finally:
                    sock.close()
            else:
                await server.serve()
        finally:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


def run_workers(settings: Settings, host: str, port: int, workers: int, extra_args: list[str]) -> int:
    """Start ``workers`` gateway processes on ``host:port`` and wait for them; returns the first non-zero exit."""
    migrate.upgrade(settings.resolved_database_url)  # once, not raced by the workers
    control_token(settings)  # a generated token is written once, before the workers read it
    argv = [sys.executable, "-m", "polar.cli", "gateway", "--host", host, "--port", str(port), "--reuse-port"]
    procs = [subprocess.Popen([*argv, *extra_args]) for _ in range(workers)]

    def stop(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [proc.wait() for proc in procs]
    return next((c for c in codes if c), 0)
