"""``GET /health`` (liveness, open to all) and ``GET /metrics`` (Prometheus, behind the control token)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from sqlalchemy.orm import Session, sessionmaker

from polar import feed, metrics
from polar.api.deps import CONTROL, RunnerDep, SettingsDep, StoreDep
from polar.api.schemas import Health
from polar.errors import StoreError
from polar.store_bound import in_store

router = APIRouter(tags=["service"])


def _current_version(factory: sessionmaker[Session]) -> str | None:
    with factory() as db:
        current = feed.current(db)
    return current.version if current else None


@router.get("/health")
async def health(settings: SettingsDep, store: StoreDep, runner: RunnerDep) -> Health:
    """Liveness: always 200 while the process serves; the store's part waits at most POLAR_HEALTH_TIMEOUT_S."""
    try:
        version = await in_store(_current_version, store.factory, timeout_s=settings.health_timeout_s)
    except StoreError:
        return Health(status="ok", dispatch=runner.mode.value, store="unavailable", current_version=None)
    return Health(status="ok", dispatch=runner.mode.value, store="ok", current_version=version)


@router.get(
    "/metrics",
    dependencies=CONTROL,
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "text format"}},
)
async def prometheus() -> Response:
    """Prometheus text format (``polar.metrics``): the process's event-loop lag and store errors."""
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)
