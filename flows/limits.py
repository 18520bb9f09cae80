"""The stage limits a rollout flow runs under: fleet-wide Prefect global concurrency limits when a Prefect server
is configured (``POLAR_STAGE_LIMITS=auto``, the default, or ``prefect``), this process's otherwise.

The limits themselves (``polar-<slot>``, created idempotently by whoever needs them) are in
``polar.prefect_adapter``, so the control API creates them too; this module picks the limiter.
"""

from __future__ import annotations

from prefect.runtime import deployment

from polar.prefect_adapter import PREFIX, PrefectLimiter, ensure_limits
from polar.rollout.fleet_limits import limit_scope, warn_unbounded
from polar.rollout.limits import Limiter, process_limiter
from polar.settings import LimitScope, Settings

__all__ = ["PREFIX", "PrefectLimiter", "ensure_limits", "make_limiter"]


def make_limiter(settings: Settings) -> Limiter:
    if limit_scope(settings) is LimitScope.PREFECT:
        return PrefectLimiter(settings)
    if deployment.get_id() is not None:  # a deployment run: this process runs this one rollout only
        warn_unbounded(settings, "rollout flow run of a deployment")
    return process_limiter(settings)
