"""Store fixtures for the trajectory tests: one migrated database per module and backend (SQLite, and Postgres
when POLAR_TEST_POSTGRES_URL is set). Tests share it, so each works on rollouts of its own and filters by them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.migrate import upgrade
from tests.pg import needs_postgres, postgres_schema, schema_url


@pytest.fixture(
    scope="module",
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=needs_postgres)],
)
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'polar.db'}"
        upgrade(url)
        yield url
        return
    with postgres_schema() as schema:
        url = schema_url(schema)
        upgrade(url)
        yield url


@pytest.fixture(scope="module")
def session_factory(store_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(store_url)
    yield make_session_factory(engine)
    engine.dispose()
