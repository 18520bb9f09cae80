"""Fixtures for the pipeline tests: a store per module and backend (SQLite; Postgres when configured), a live
gateway on it (the session's local engine as backend), and a rollout context pointed at both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from db.migrate import upgrade
from polar.backends.local import LocalBackend
from polar.proxy.embedded import EmbeddedGateway
from polar.rollout import RolloutContext
from tests.pg import needs_postgres, postgres_schema, schema_url
from tests.rollout.helpers import test_settings


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'polar.db'}"
    upgrade(url)
    return url


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with postgres_schema() as schema:
        url = schema_url(schema)
        upgrade(url)
        yield url


@pytest.fixture(
    scope="module",
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=needs_postgres)],
)
def store_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_url")


def start_gateway(tmp: Path, cache: Path, url: str, engine) -> EmbeddedGateway:
    return EmbeddedGateway(test_settings(tmp, cache, url), backend=LocalBackend(engine)).start()


@pytest.fixture(scope="module")
def sqlite_gateway(tmp_path_factory, cache_dir, sqlite_url, engine) -> Iterator[EmbeddedGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, sqlite_url, engine)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def context(tmp_path_factory, cache_dir, sqlite_url, sqlite_gateway) -> Iterator[RolloutContext]:
    """A context on the module's SQLite store and gateway."""
    settings = test_settings(tmp_path_factory.mktemp("home"), cache_dir, sqlite_url)
    ctx = RolloutContext.create(settings, gateway_url=sqlite_gateway.url)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def store_context(tmp_path_factory, cache_dir, store_url, engine) -> Iterator[RolloutContext]:
    """A context and gateway on each backend's store (SQLite, and Postgres when configured)."""
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, store_url, engine)
    settings = test_settings(tmp_path_factory.mktemp("home"), cache_dir, store_url)
    ctx = RolloutContext.create(settings, gateway_url=gateway.url)
    yield ctx
    ctx.close()
    gateway.stop()
