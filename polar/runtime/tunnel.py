"""The host half of a sandbox's only way out: a Unix socket that forwards to one TCP service (the gateway).

A runtime without a network bind-mounts the socket's folder; inside, a relay (``polar/assets/relay.js``)
listens on loopback and pipes each connection to the socket. The tunnel forwards bytes to exactly one
``host:port`` and nothing else, so a harness reaches its gateway session and no other service. The socket is
created with mode 0600 (only root in the sandbox, as the harness runs, may connect).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("polar.runtime")

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
