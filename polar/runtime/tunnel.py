"""The host half of a sandbox's only way out: a Unix socket that forwards to one TCP service (the gateway).

A runtime without a network bind-mounts the socket's folder; inside, a relay (``polar/assets/relay.js``)
listens on loopback and pipes each connection to the socket. The tunnel forwards bytes to exactly one
``host:port`` and nothing else, so a harness reaches its gateway session and no other service. The socket is
created with mode 0600 (only root in the sandbox, as the harness runs, may connect). ``gateway_tunnel`` is
both halves together, for any runtime that can start a detached process inside its sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from polar.errors import SandboxError

log = logging.getLogger(__name__)

CHUNK = 65_536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class UnixTunnel:
    """Forwards connections on ``socket_path`` to ``host:port`` while open (``async with``)."""

    def __init__(self, socket_path: Path, host: str, port: int):
        self.socket_path, self.host, self.port = socket_path, host, port
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            log.warning("tunnel %s: cannot reach %s:%s: %s", self.socket_path, self.host, self.port, exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __aenter__(self) -> UnixTunnel:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a socket left by a dead process: nothing listens on it any more
        self._server = await asyncio.start_unix_server(self._track, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


RELAY = Path(__file__).resolve().parents[1] / "assets" / "relay.js"
SANDBOX_SOCKET_DIR = "/run/polar"  # where a sandbox sees the tunnel's socket folder (bind-mounted)

RelayStart = Callable[[list[str], Path], Awaitable[None]]
"""Starts the relay's argv inside the sandbox, detached, its output to the given log file."""
RelayStop = Callable[[int], Awaitable[None]]
"""Kills the relay (its pid inside the sandbox)."""


@contextlib.asynccontextmanager
async def gateway_tunnel(
    url: str, *, socket_dir: Path, private: Path, tools_dir: Path, start: RelayStart, stop: RelayStop, where: str
) -> AsyncIterator[str]:
    """While open: ``url``'s service reachable inside a sandbox without a network; yields the URL to use there.

    The host end listens on ``socket_dir/gateway.sock`` (bind-mounted at ``SANDBOX_SOCKET_DIR``); the relay runs on
    the tools folder's Node from ``private`` (a folder both sides see) and listens on the same port on the
    sandbox's loopback, so the URL inside is ``url`` with the host replaced by 127.0.0.1.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    node = tools_dir / "node" / "bin" / "node"
    if not node.exists():
        raise SandboxError(
            f"the gateway relay needs Node in the tools folder ({node}): run `polar harness install node`"
        )
    relay, ready = private / "relay.js", private / f"relay-{port}.ready"
    shutil.copyfile(RELAY, relay)
    ready.unlink(missing_ok=True)
    async with UnixTunnel(socket_dir / "gateway.sock", host, port):
        log_file = Path(f"{ready}.log")
        await start([str(node), str(relay), f"{SANDBOX_SOCKET_DIR}/gateway.sock", str(port), str(ready)], log_file)
        deadline = time.monotonic() + 15
        while not (ready.exists() and ready.read_text()):
            if time.monotonic() > deadline:
                log = log_file.read_text(errors="replace")[-300:] if log_file.exists() else ""
                raise SandboxError(f"the gateway relay in {where} did not start: {log}")
            await asyncio.sleep(0.01)
        relay_pid = int(ready.read_text())
        try:
            yield urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))
        finally:
            with contextlib.suppress(Exception):
                await stop(relay_pid)
