"""The control API's routes, one ``APIRouter`` per resource: ``service`` (``/health``, ``/metrics``), ``tasks``,
``rollouts``, ``trajectories``, ``trainer`` (``/v1/model`` and the claims feed) and ``weights``. Their
dependencies are in ``polar.api.deps``, their replies in ``polar.api.schemas``."""

from fastapi import APIRouter

from polar.api.routes import rollouts, service, tasks, trainer, trajectories, weights

ROUTERS: tuple[APIRouter, ...] = (
    service.router,
    tasks.router,
    rollouts.router,
    trajectories.router,
    trainer.router,
    weights.router,
)
