"""Idle client connections (HTTP keep-alive): the gateway keeps one open ``connection_idle_s`` for the client's next
call, longer than clients' own pools keep theirs (httpx 5 s), so it is the client that closes an idle connection
and no call is sent on one the gateway is closing (with uvicorn's 5 s a call could meet the close: a read error,
seen at 96 agent sessions). One raw socket, two requests on it, an idle gap between them."""

from __future__ import annotations

import socket
import time

from polar.backends.local import LocalBackend
from tests.proxy.gateway_server import GatewayServer, settings_for

REQUEST = b"GET /health/live HTTP/1.1\r\nHost: gateway\r\n\r\n"


def _ask(sock: socket.socket) -> bytes:
    """One request on ``sock`` and its whole reply (head and Content-Length body), so none is left for the next."""
    sock.sendall(REQUEST)
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            return reply
        reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def test_an_idle_connection_outlives_a_clients_pool_expiry(tmp_path, cache_dir, engine):
    with GatewayServer(settings_for(tmp_path, cache_dir), backend=LocalBackend(engine)) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            assert _ask(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6.0)  # past uvicorn's own 5 s and httpx's pool expiry
            assert _ask(sock).startswith(b"HTTP/1.1 200")


def test_the_gateway_closes_a_connection_idle_past_the_setting(tmp_path, cache_dir, engine):
    settings = settings_for(tmp_path, cache_dir, connection_idle_s=1)
    with GatewayServer(settings, backend=LocalBackend(engine)) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            assert _ask(sock).startswith(b"HTTP/1.1 200")
            time.sleep(2.5)
            assert sock.recv(4096) == b""  # closed by the gateway
