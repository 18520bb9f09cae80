"""Feed fixtures: a fresh migrated store per test on SQLite and (when configured) Postgres, and synthetic groups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.migrate import upgrade
from tests.pg import needs_postgres, postgres_schema, schema_url


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=needs_postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'polar.db'}"
        upgrade(url)
        yield url
        return
    with postgres_schema() as schema:
        url = schema_url(schema)
        upgrade(url)
        yield url


@pytest.fixture
def factory(store_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(store_url)
    yield make_session_factory(engine)
    engine.dispose()
