"""A gateway inside the current process: uvicorn on a loopback port, in a background thread with its own loop.

The embedded set-up (``polar demo``, a flow process without ``POLAR_GATEWAY_URL``) and tests use it; harnesses
reach it over real HTTP like any gateway. The socket is bound before the server starts (port 0 picks a free
one), so there is no window in which another process can take the port.

    with EmbeddedGateway(settings) as gateway:
        gateway.url  # http://127.0.0.1:PORT
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Self

import httpx
import uvicorn
import uvloop

from polar.inference import Backend
from polar.settings import Settings

if TYPE_CHECKING:
    from polar.proxy.gateway import Gateway

STARTUP_TIMEOUT_S = 120.0


class EmbeddedGateway:
    def __init__(self, settings: Settings, backend: Backend | None = None, *, host: str = "127.0.0.1", port: int = 0):
        self.settings = settings
        self.backend = backend
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.gateway: Gateway | None = None  # the Gateway, once started
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._run, name="polar-embedded-gateway", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            uvloop.run(self._serve())  # the loop `polar gateway` runs on
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it in the caller
            self._error = exc

    async def _serve(self) -> None:
        from polar.proxy.gateway import Gateway
        from polar.proxy.http.app import create_app
        from polar.proxy.server import uvicorn_config

        self.gateway = gateway = await Gateway.create(self.settings, backend=self.backend)
        config = uvicorn_config(create_app(gateway), self.settings)
        self._server = uvicorn.Server(config)
        await self._server.serve(sockets=[self._socket])

    def start(self) -> Self:
        """Start serving and wait until ``/health`` answers; raises what stopped the gateway from starting."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._error is not None:
                raise self._error
            if not self._thread.is_alive():
                raise RuntimeError("the embedded gateway stopped while starting")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"the embedded gateway did not answer on {self.url} within {STARTUP_TIMEOUT_S:g} s")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=20)
        self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded(settings: Settings) -> EmbeddedGateway:
    """A gateway in this process, serving until stopped: what entry points pass the rollout context
    (``polar.rollout.context``) when ``POLAR_GATEWAY_URL`` is empty."""
    return EmbeddedGateway(settings).start()
