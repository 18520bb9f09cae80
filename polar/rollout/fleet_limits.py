"""Which kind of stage limits a process uses: counted fleet-wide by the Prefect server, or per process.

Each slot (``ready``, ``init``, ``run``, ``postrun``) is a Prefect global concurrency limit named
``polar-<slot>``, so every worker's rollouts share one count: more workers on the pool add throughput but never
exceed the limits. ``POLAR_STAGE_LIMITS=auto`` (the default) counts fleet-wide whenever a Prefect server is
configured (``PREFECT_API_URL``) and per process otherwise (the embedded mode, where every rollout flow of a
batch runs in one process).

The fleet-wide limits themselves live in ``polar.prefect_adapter`` (the library's one Prefect module). They are
created idempotently by whoever needs them: the batch and retry flows and the control API create
or resize them from their settings before dispatching (``ensure_limits``), and a rollout flow that finds one
missing (a worker's first flow run, a control-API rollout on a fresh server) creates it without resizing it.
Creation races between processes are harmless: whoever loses reads the winner's limit.

Each slot is a lease of ``POLAR_LIMIT_LEASE_S`` (default 60 s, the least the Prefect server accepts; Prefect's own
default is 300 s) that the Prefect client renews while it is held (a thread renews it every 3/4 of the lease, and
the holder is cancelled if renewal fails, so no slot is ever used unleased). A holder killed with ``kill -9`` (a
dead worker host) renews nothing: the server's repossessor frees its slot once the lease has run out, within
``PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS`` (default 15) after that, and the rest of the fleet goes on.
"""

from __future__ import annotations

import logging

from polar.settings import LimitScope, Settings

log = logging.getLogger(__name__)


def limit_scope(settings: Settings) -> LimitScope:
    """``POLAR_STAGE_LIMITS`` with ``auto`` resolved."""
    if settings.stage_limits is not LimitScope.AUTO:
        return settings.stage_limits
    return LimitScope.PREFECT if settings.prefect_api_url else LimitScope.PROCESS


_warned: set[str] = set()


def warn_unbounded(settings: Settings, where: str) -> str | None:
    """Warn (once per process and place) when process-local limits are used where each rollout flow runs in a
    process of its own (a Prefect process pool), so they bound nothing; returns the warning given, if any."""
    if limit_scope(settings) is not LimitScope.PROCESS:
        return None
    message = (
        f"{where}: POLAR_STAGE_LIMITS is process-local but rollout flows run in processes of their own (a Prefect "
        "process pool): the stage limits and the READY buffer bound nothing; set POLAR_STAGE_LIMITS=prefect "
        "(or auto with PREFECT_API_URL)"
    )
    if where not in _warned:
        _warned.add(where)
        log.warning(message)
    return message
