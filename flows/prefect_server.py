"""Prefect for a ``polar`` command: its settings, and its temporary server started once and stopped with the process.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server (a uvicorn subprocess) the first time one of
its clients needs it, from whichever thread gets there first, and its start is not thread-safe: two threads (a
flow's heartbeat, the events worker, an owner probe in a worker thread) can each start one, and only the last is
stopped at exit, so one is left running. ``temporary_server`` starts it instead, once, in the main thread, before
any flow runs, and stops it when the command ends: on return, on an error, and on SIGTERM (which ``polar.cli``
turns into ``SystemExit``, and which ``polar serve``'s uvicorn raises again once it has shut down). Every later
Prefect client in the process finds that one server running (``SubprocessASGIServer()`` is one per process).

That server listens on loopback, where a harness in the local runtime (which shares the host's network to reach
the gateway) could reach it too. So it is started locked: Prefect's basic auth, with a random secret made per
start and set in this process's environment before the server starts, on the server's side
(``PREFECT_SERVER_API_AUTH_STRING``: every route but ``/health`` and ``/ready`` answers 401 without it) and on
its clients' (``PREFECT_API_AUTH_STRING``). The secret lives only in this process's environment and what it
starts with that environment (the server itself); runtimes give their commands a clean environment, so no
harness sees it. Both variables are restored when the server stops.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from polar.settings import Settings

AUTH_VARIABLES = ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING")


def prepare_prefect_environment(settings: Settings) -> None:
    """Prefect reads its settings when first imported: aim it at POLAR_HOME, quiet, without telemetry."""
    home = settings.home / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@contextmanager
def temporary_server(settings: Settings) -> Iterator[str | None]:
    """Prefect's temporary server for the duration of the block; yields its API URL (None: ``PREFECT_API_URL``
    names a real server, and nothing is started)."""
    prepare_prefect_environment(settings)
    if settings.prefect_api_url:
        yield None
        return
    from prefect.server.api.server import SubprocessASGIServer

    previous = _lock()
    server = SubprocessASGIServer()
    try:
        server.start()
        yield server.api_url
    finally:
        if server.running:
            _drain_workers()
            server.stop()
        _restore(previous)


def _lock() -> dict[str, str | None]:
    """A fresh basic-auth secret on both the server's and the clients' side; returns what they were before."""
    previous = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    secret = f"polar:{secrets.token_urlsafe(32)}"
    for name in AUTH_VARIABLES:
        os.environ[name] = secret
    _refresh_prefect_settings()
    return previous


def _restore(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _refresh_prefect_settings()


def _refresh_prefect_settings() -> None:
    """Prefect reads its environment once, into its global settings context, when first imported: when it already
    was (a flow module imported earlier), that context is rebuilt so its clients and the server see the change."""
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


def _drain_workers(timeout_s: float = 10.0) -> None:
    """Send what Prefect's background workers still hold (run logs, events) while its server is up: drained only at
    interpreter exit, after the server stopped, they failed with "--- Error logging to API ---"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)
