"""The test gateway server with uvicorn's access log on (requests, WebSocket refusals) for the run's log file."""

from __future__ import annotations

import re
from pathlib import Path

import uvicorn

from tests.proxy.gateway_server import GatewayServer


class LoggingGatewayServer(GatewayServer):
    """``GatewayServer`` whose uvicorn logs through the root logger (the runner sends it to gateway.log)."""

    async def _main(self) -> None:
        from polar.proxy.gateway import Gateway
        from polar.proxy.http.app import create_app

        self.gateway = await Gateway.create(self.settings, backend=self.backend)
        config = uvicorn.Config(
            create_app(self.gateway),
            host="127.0.0.1",
            port=self.port,
            log_level="info",
            log_config=None,
            access_log=True,
        )
        self._server = uvicorn.Server(config)
        await self._server.serve()


REQUEST_LINE = re.compile(r'"(?P<method>[A-Z]+|WebSocket) (?P<path>\S+)(?: HTTP/[\d.]+)?" (?P<status>\d{3})')


def requests_in_log(log: Path) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request uvicorn logged; WebSocket attempts have method 'WebSocket'."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = REQUEST_LINE.search(line)
        if m:
            out.append((m["method"], m["path"], int(m["status"])))
    return out
