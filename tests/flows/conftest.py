"""Flow-test fixtures: a temporary Prefect server (``prefect_test_harness``, SQLite, one per module), a store and
a live gateway per backend, and the POLAR_* environment the flows read their settings from.

Prefect gets its own database, never the store's (both keep an ``alembic_version`` table)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from polar.proxy.embedded import EmbeddedGateway
from polar.rollout.context import close_contexts
from polar.settings import get_settings
from tests.rollout.conftest import postgres_url, sqlite_url, start_gateway, store_url  # noqa: F401


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API URL of a temporary Prefect server for this module's flows."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, cache_dir, store_url, engine) -> Iterator[EmbeddedGateway]:
    gw = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, store_url, engine)
    yield gw
    gw.stop()


STALE_AFTER_S = 4.0


async def wait_out_staleness() -> None:
    """Wait until a killed flow's rollouts are silent for ``POLAR_STALE_AFTER_S``, so a retry may take them over."""
    import asyncio

    await asyncio.sleep(STALE_AFTER_S + 0.5)


def polar_environment(tmp: Path, cache: Path, database_url: str, gateway_url: str, **overrides: str) -> dict[str, str]:
    env = {
        "POLAR_HOME": str(tmp),
        "POLAR_CACHE": str(cache),
        "POLAR_DATABASE_URL": database_url,
        "POLAR_GATEWAY_URL": gateway_url,
        "POLAR_RUNTIME_ROOT": str(tmp / "runtimes"),
        "POLAR_HEARTBEAT_S": "1",
        # A killed flow run's rollouts may be taken over once silent this long (Prefect still has them Running).
        "POLAR_STALE_AFTER_S": str(STALE_AFTER_S),
        "POLAR_STAGE_RETRY_DELAY_S": "0",
        "POLAR_ALLOW_SCRIPTED_POLICIES": "1",  # the toy tasks script their replies
    }
    env.update(overrides)
    return env


@pytest.fixture
def flow_env(monkeypatch, tmp_path, cache_dir, store_url, gateway, prefect_server):
    """Sets the POLAR_* environment for this test's flows; ``flow_env(**overrides)`` changes settings."""

    def apply(**overrides: str) -> dict[str, str]:
        env = polar_environment(tmp_path, cache_dir, store_url, gateway.url, **overrides)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        return env

    apply()
    yield apply
    close_contexts()
    get_settings.cache_clear()
