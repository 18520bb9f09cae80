"""Control-API fixtures: a temporary Prefect server, a SQLite store, a gateway whose engine this package may
reload (its own, not the session's shared one), the POLAR_* environment the inline flows read, and the API
itself served on a loopback port with its background loop running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flows.dispatch import run_inline
from polar.api import create_api
from polar.models.engine import LocalEngine
from polar.rollout.context import close_contexts, store_factory
from polar.serving.threaded import ServerThread
from polar.settings import get_settings
from tests.flows.conftest import polar_environment, prefect_server  # noqa: F401
from tests.rollout.conftest import sqlite_url, start_gateway  # noqa: F401


@pytest.fixture(scope="module")
def api_engine(tiny_model_dir, small_tokenizer) -> Iterator[LocalEngine]:
    engine = LocalEngine(tiny_model_dir, small_tokenizer)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def api_gateway(tmp_path_factory, cache_dir, sqlite_url, api_engine):
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, sqlite_url, api_engine)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def api_env(tmp_path_factory, cache_dir, sqlite_url, api_gateway, prefect_server):
    env = polar_environment(
        tmp_path_factory.mktemp("home"),
        cache_dir,
        sqlite_url,
        api_gateway.url,
        POLAR_TASK_DISPATCH="inline",
        POLAR_API_POLL_S="0.1",
        POLAR_CALLBACK_BACKOFF_S="0.2",
        POLAR_MAX_ASYNC_LEVEL="0",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        yield get_settings()
        close_contexts()
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def api(api_env, api_gateway) -> Iterator[ServerThread]:
    app = create_api(api_env, store_factory(api_env), gateway_url=api_gateway.url, run_inline=run_inline)
    with ServerThread(app, lifespan="on") as server:
        yield server
