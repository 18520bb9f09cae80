"""A small fleet for the live-view tests: gateway processes (``polar gateway``, each over the tiny local model,
registering in a shared SQLite store with a fast heartbeat) that a test can kill with SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.proxy.gateway_server import free_port

HEARTBEAT_S = 0.5
STALE_S = 3.0


def fleet_env(home: Path, cache: Path, database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "POLAR_HOME": str(home),
        "POLAR_CACHE": str(cache),
        "POLAR_DATABASE_URL": database_url,
        "POLAR_GATEWAY_HEARTBEAT_S": str(HEARTBEAT_S),
        "POLAR_GATEWAY_STALE_S": str(STALE_S),
        "POLAR_ALLOW_SCRIPTED_POLICIES": "1",
    }


@dataclass
class GatewayProcess:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def registry_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def start_gateways(n: int, env: dict[str, str], logs: Path, timeout_s: float = 180.0) -> list[GatewayProcess]:
    """``n`` gateway processes, started together, each answering ``/health`` (and so registered) on return; each
    one's output goes to ``logs``/gateway-<port>.log."""
    started = []
    for _ in range(n):
        port = free_port()
        with (logs / f"gateway-{port}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "polar.cli", "gateway", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(GatewayProcess(proc, port))
    deadline = time.monotonic() + timeout_s
    for gateway in started:
        while True:
            try:
                if httpx.get(gateway.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if gateway.proc.poll() is not None or time.monotonic() > deadline:
                for other in started:
                    other.proc.kill()
                raise AssertionError((logs / f"gateway-{gateway.port}.log").read_text(errors="replace")[-3000:])
            time.sleep(0.3)
    return started
