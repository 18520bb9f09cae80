"""A control API served in a process of its own (``tests.api.guarded_server``), and raw-socket helpers: what an
attacker's client does (a body that never ends, headers that never end) needs sockets, not an HTTP client."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.proxy.gateway_server import free_port

TOKEN = "guard-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]


class Served:
    """``with Served(home, database_url, POLAR_X=...) as api: api.url, api.rss()``."""

    def __init__(self, home: Path, database_url: str, **settings: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "api.log"
        self.env = {
            **os.environ,
            "POLAR_HOME": str(home),
            "POLAR_DATABASE_URL": database_url,
            "POLAR_CONTROL_TOKEN": TOKEN,
            "POLAR_TASK_DISPATCH": "inline",
            **settings,
        }
        self.env.pop("PREFECT_API_URL", None)
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Served:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.api.guarded_server", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError(self.log.read_text())

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def rss(self) -> int:
        """The server process's resident memory, in bytes."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def upload(port: int, path: str, headers: dict[str, str], total: int, chunk: int = 1 << 20) -> tuple[bytes, int, float]:
    """POST a chunked body of ``total`` bytes, watching for an answer before each chunk; returns the answer's first
    bytes, how many body bytes went out before it came (or the connection broke), and the seconds it took."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    piece = f"{chunk:x}\r\n".encode() + b"{" * chunk + b"\r\n"
    sent = 0
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(piece)
            except OSError:  # the server closed the connection: its answer is already on its way or here
                break
            sent += chunk
        else:
            sock.sendall(b"0\r\n\r\n")
        reply = _answer(sock)
    return reply, sent, time.monotonic() - started


def _answer(sock: socket.socket) -> bytes:
    """The answer's head and its body (``content-length``): the server may write them apart."""
    reply = b""
    try:
        while data := sock.recv(65536):
            reply += data
            head, found, body = reply.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if found and len(body) >= (int(length[1]) if length else 0):
                break
    except (ConnectionResetError, TimeoutError):  # closed after answering, with our unsent chunks in flight
        pass
    return reply


def closed_after(port: int, opening: bytes, limit_s: float) -> float | None:
    """Send ``opening`` and wait up to ``limit_s`` for the server to close the connection; the seconds it took, or
    None if it was still open."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        started = time.monotonic()
        if opening:
            sock.sendall(opening)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return time.monotonic() - started
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - started


def declared(port: int, path: str, headers: dict[str, str], length: int) -> bytes:
    """Send a POST's headers declaring a ``length``-byte body, and no body: the answer the headers alone get."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return sock.recv(65536)
