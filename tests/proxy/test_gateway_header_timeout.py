"""The gateway closes a connection whose request headers are not complete within ``POLAR_HEADER_TIMEOUT_S``
(uvicorn alone only times out idle keep-alive connections), and serves whole requests as before."""

from __future__ import annotations

import httpx

from tests.api.served import closed_after
from tests.proxy.gateway_server import GatewayServer, settings_for


def test_unfinished_headers_are_closed_and_whole_requests_served(tmp_path, cache_dir):
    with GatewayServer(settings_for(tmp_path, cache_dir, header_timeout_s=1)) as gw:
        silent = closed_after(gw.port, b"", 10)
        partial = closed_after(gw.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor", 10)
        assert silent is not None and 0.8 < silent < 4
        assert partial is not None and 0.8 < partial < 4  # far below POLAR_CONNECTION_IDLE_S (75 s)
        assert httpx.get(gw.url + "/health/live").status_code == 200
