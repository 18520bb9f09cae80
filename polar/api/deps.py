"""What the control API's routes depend on, in one place: ``create_api`` keeps one ``ApiState`` on
``app.state.api`` and the routes take its parts with FastAPI ``Depends`` (the ``Annotated`` aliases below).

- ``Store``: the store, every wait of a request bounded by ``POLAR_STORE_STATEMENT_TIMEOUT_S`` (then a
  ``StoreError``: a 503 with ``Retry-After``), the work done in a worker thread.
- ``require_control``: the control token as a Bearer token. ``polar.api.guard`` already refused a request
  without it before its body was read; this check keeps every ``/v1`` route closed on its own.
- the settings, the ``TaskRunner`` (also on ``app.state.runner``), the control token in force, and ``wake``, which
  starts the background pass (admission, dispatch, callbacks) now instead of at its next poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Concatenate, ParamSpec, TypeVar

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from polar.api.guard import CONTROL_MESSAGE
from polar.api.runner import TaskRunner
from polar.auth import bearer_of, matches
from polar.errors import AuthenticationError
from polar.settings import Settings
from polar.store_bound import in_store

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Store:
    """The store as a request reaches it: each call runs in a worker thread and waits at most ``timeout_s``."""

    factory: sessionmaker[Session]
    timeout_s: float

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        """``fn(*args, **kwargs)``, bounded (``fn`` opens its own sessions, from ``factory``)."""
        return in_store(fn, *args, timeout_s=self.timeout_s, **kwargs)

    def read(self, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        """``fn(db, *args, **kwargs)`` in a session of its own, bounded."""

        def run() -> T:
            with self.factory() as db:
                return fn(db, *args, **kwargs)

        return in_store(run, timeout_s=self.timeout_s)


@dataclass(frozen=True)
class ApiState:
    settings: Settings
    store: Store
    runner: TaskRunner
    token: str  # the control token in force (generated on first start when none is set)
    gateway_url: str | None  # the rollouts' gateway: a default target of new weights
    wake: asyncio.Event  # set: the background pass runs now

    @classmethod
    def of(cls, request: Request) -> ApiState:
        state: ApiState = request.app.state.api
        return state


def _settings(request: Request) -> Settings:
    return ApiState.of(request).settings


def _store(request: Request) -> Store:
    return ApiState.of(request).store


def _runner(request: Request) -> TaskRunner:
    return ApiState.of(request).runner


async def require_control(request: Request) -> None:
    """Refuse a request without the control token (``AuthenticationError``: a 401)."""
    if not matches(bearer_of(request.headers.get("authorization")), ApiState.of(request).token):
        raise AuthenticationError(CONTROL_MESSAGE)


StateDep = Annotated[ApiState, Depends(ApiState.of)]
SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[Store, Depends(_store)]
RunnerDep = Annotated[TaskRunner, Depends(_runner)]
# Every /v1 route and /metrics: ``dependencies=CONTROL``.
CONTROL = [Depends(require_control)]
