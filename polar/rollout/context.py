"""What the stages share in one process: settings, the store, the gateway, a model for judges.

``rollout_context(settings, start_gateway=...)`` builds it once per distinct settings and process: it migrates
the store, and when ``POLAR_GATEWAY_URL`` is empty it starts a gateway in this process with ``start_gateway``
(the embedded default: ``polar demo`` needs no server). The pipeline never builds a gateway itself: the entry
points (the flows, ``polar serve``, benchmarks) pass ``polar.proxy.embedded.start_embedded``. Building may take
seconds (the gateway loads the model), so async code calls ``get_context``, which builds in a worker thread.
Flows that only submit or read use ``get_store`` (no gateway). ``close_contexts`` stops what was started
(tests, demo exit).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from db import make_engine, make_session_factory, migrate
from polar.auth import control_token
from polar.errors import ConfigError
from polar.evaluators.base import ChatModel
from polar.evaluators.chat import BackendChat
from polar.rollout.gateway_client import GatewayClient
from polar.settings import Settings, get_settings


class LocalGateway(Protocol):
    """A gateway this process started for its rollouts; stopped with the context."""

    url: str

    def stop(self) -> None: ...


GatewayStarter = Callable[[Settings], LocalGateway]


@dataclass
class RolloutContext:
    settings: Settings
    engine: Engine
    factory: sessionmaker[Session]
    gateway: GatewayClient
    chat: ChatModel
    python: str = field(default=sys.executable)  # the interpreter harnesses and checks of this package run on
    embedded: LocalGateway | None = None

    @classmethod
    def create(
        cls,
        settings: Settings,
        *,
        gateway_url: str | None = None,
        chat: ChatModel | None = None,
        start_gateway: GatewayStarter | None = None,
    ) -> RolloutContext:
        url = settings.resolved_database_url
        migrate.upgrade(url)
        engine = make_engine(url)
        embedded = None
        gateway_url = gateway_url or settings.gateway_url
        if not gateway_url:
            if start_gateway is None:
                engine.dispose()
                raise ConfigError(
                    "POLAR_GATEWAY_URL is empty and this entry point starts no gateway of its own", field="gateway_url"
                )
            embedded = start_gateway(settings)
            gateway_url = embedded.url
        return cls(
            settings=settings,
            engine=engine,
            factory=make_session_factory(engine),
            gateway=GatewayClient(gateway_url, control_token=control_token(settings)),
            chat=chat or BackendChat(settings),
            embedded=embedded,
        )

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
        self.engine.dispose()


_contexts: dict[str, RolloutContext] = {}
_lock = threading.Lock()


def rollout_context(settings: Settings | None = None, *, start_gateway: GatewayStarter | None = None) -> RolloutContext:
    """This process's context for ``settings`` (default: the environment's), built on first use (with
    ``start_gateway`` when no gateway URL is configured)."""
    settings = settings or get_settings()
    key = settings.model_dump_json()
    with _lock:
        context = _contexts.get(key)
        if context is None:
            context = _contexts[key] = RolloutContext.create(settings, start_gateway=start_gateway)
        return context


async def get_context(
    settings: Settings | None = None, *, start_gateway: GatewayStarter | None = None
) -> RolloutContext:
    return await asyncio.to_thread(functools.partial(rollout_context, settings, start_gateway=start_gateway))


_stores: dict[str, tuple[Engine, sessionmaker[Session]]] = {}


def store_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    """Sessions on the (migrated) store alone, for flows that only submit or read (no gateway started)."""
    settings = settings or get_settings()
    url = settings.resolved_database_url
    with _lock:
        if url not in _stores:
            migrate.upgrade(url)
            engine = make_engine(url)
            _stores[url] = (engine, make_session_factory(engine))
        return _stores[url][1]


async def get_store(settings: Settings | None = None) -> sessionmaker[Session]:
    return await asyncio.to_thread(store_factory, settings)


def close_contexts() -> None:
    with _lock:
        contexts = list(_contexts.values())
        engines = [engine for engine, _ in _stores.values()]
        _contexts.clear()
        _stores.clear()
    for context in contexts:
        context.close()
    for engine in engines:
        engine.dispose()


atexit.register(close_contexts)
