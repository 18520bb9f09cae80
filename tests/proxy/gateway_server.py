"""A live gateway on a free loopback port, in a background thread, for tests that use real clients."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from polar.auth import control_token
from polar.inference import Backend
from polar.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayServer:
    """``with GatewayServer(settings, backend) as gw: gw.url`` — stopped and joined on exit."""

    start_timeout_s = 60.0  # a real model's tokenizer and the backend check take longer on a loaded machine

    def __init__(self, settings: Settings, backend: Backend | None = None):
        self.settings = settings
        self.backend = backend
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.gateway = None
        self.control = {"Authorization": f"Bearer {control_token(settings)}"}
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 -- surfaced by __enter__
            self._error = exc

    async def _main(self) -> None:
        from polar.proxy.gateway import Gateway
        from polar.proxy.http.app import create_app
        from polar.proxy.server import uvicorn_config

        self.gateway = await Gateway.create(self.settings, backend=self.backend)
        config = uvicorn_config(create_app(self.gateway), self.settings, host="127.0.0.1", port=self.port)
        self._server = uvicorn.Server(config)
        await self._server.serve()

    def __enter__(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._error:
                raise self._error
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("gateway did not start")

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(timeout=20)

    def session(self, policy: dict | None = None, **extra) -> dict:
        reply = httpx.post(
            self.url + "/v1/sessions", json={"policy": policy, **extra}, headers=self.control, timeout=10
        )
        reply.raise_for_status()
        return reply.json()

    def close_session(self, session_id: str) -> None:
        httpx.post(f"{self.url}/v1/sessions/{session_id}/close", headers=self.control, timeout=10).raise_for_status()

    def captures(
        self, session_id: str, key: str | None = None, full_prompt: bool = True, requests: bool = False
    ) -> list[dict]:
        headers = {"Authorization": f"Bearer {key}"} if key else self.control
        params = {"full_prompt": full_prompt, "requests": requests}
        reply = httpx.get(f"{self.url}/v1/sessions/{session_id}/captures", params=params, headers=headers, timeout=10)
        reply.raise_for_status()
        return reply.json()["captures"]


def settings_for(tmp: Path, cache: Path, database_url: str | None = None, **overrides) -> Settings:
    return Settings(home=tmp, cache=cache, database_url=database_url or f"sqlite:///{tmp / 'gateway.db'}", **overrides)
