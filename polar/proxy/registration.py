"""A gateway replica's entry in the gateway registry (``db.gateways``): registered at start, a heartbeat every
``POLAR_GATEWAY_HEARTBEAT_S`` while it serves, marked draining when it begins shutting down (``watch_drain``: the
live view shows DRAINING while it finishes the calls it holds) and stopped at the end. The control API pushes new
weights to every live entry. The URL is ``POLAR_GATEWAY_ADVERTISE_URL`` (how other hosts reach it), else host
and port."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from sqlalchemy.orm import Session, sessionmaker

from db import gateways
from polar.clock import now
from polar.settings import Settings

log = logging.getLogger(__name__)


def advertised_url(settings: Settings, host: str, port: int) -> str:
    if settings.gateway_advertise_url:
        return settings.gateway_advertise_url
    reachable = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    return f"http://{reachable}:{port}"


def registry_id(url: str) -> str:
    """The replica's id: where others reach it (``host:port`` of its URL; hosts may share a hostname, as network
    namespaces on one machine do, but not an address), hashed when longer than the column."""
    netloc = urlsplit(url).netloc
    return netloc if 0 < len(netloc) <= 64 else hashlib.blake2b(url.encode(), digest_size=16).hexdigest()


@contextlib.asynccontextmanager
async def registered(factory: sessionmaker[Session], settings: Settings, host: str, port: int) -> AsyncIterator[str]:
    """Keeps this replica registered while the block runs; yields its registry id."""
    url = advertised_url(settings, host, port)
    gateway_id = registry_id(url)
    await asyncio.to_thread(gateways.register, factory, gateway_id, url, now())

    async def beat() -> None:
        while True:
            await asyncio.sleep(settings.gateway_heartbeat_s)
            try:
                await asyncio.to_thread(gateways.heartbeat, factory, gateway_id, now())
            except Exception:
                log.warning("gateway %s: registry heartbeat failed", gateway_id, exc_info=True)

    task = asyncio.create_task(beat())
    try:
        yield gateway_id
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(gateways.deregister, factory, gateway_id, now())


async def watch_drain(
    factory: sessionmaker[Session], gateway_id: str, shutting_down: Callable[[], bool], poll_s: float = 0.1
) -> None:
    """Waits until ``shutting_down()`` (uvicorn's ``should_exit``, set by SIGTERM or SIGINT) and announces the drain
    in the registry. Polling a flag, not a signal handler of our own, keeps uvicorn's handling (and its graceful
    wait for in-flight calls) as it is. Run it as a task for the server's life; cancel it after."""
    while not shutting_down():
        await asyncio.sleep(poll_s)
    try:
        await asyncio.to_thread(gateways.drain, factory, gateway_id, now())
        log.info("gateway %s: draining", gateway_id)
    except Exception:
        log.warning("gateway %s: could not announce the drain", gateway_id, exc_info=True)
