"""Prefect for a ``polar`` command: its settings, and its temporary server started once and stopped with the process.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server (a uvicorn subprocess) the first time one of
its clients needs it, from whichever thread gets there first, and its start is not thread-safe: two threads (a
flow's heartbeat, the events worker, an owner probe in a worker thread) can each start one, and only the last is
stopped at exit, so one is left running. ``temporary_server`` starts it instead, once, in the main thread, before
any flow runs, and stops it when the command ends: on return, on an error, and on SIGTERM (which ``polar.cli``
turns into ``SystemExit``, and which ``polar serve``'s uvicorn raises again once it has shut down). Every later
Prefect client in the process finds that one server running (``SubprocessASGIServer()`` is one per process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from polar.settings import Settings


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

    server = SubprocessASGIServer()
    server.start()
    try:
        yield server.api_url
    finally:
        _drain_workers()
        server.stop()


def _drain_workers(timeout_s: float = 10.0) -> None:
    """Send what Prefect's background workers still hold (run logs, events) while its server is up: drained only at
    interpreter exit, after the server stopped, they failed with "--- Error logging to API ---"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)
