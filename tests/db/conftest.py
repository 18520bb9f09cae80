"""Store fixtures: each test gets a fresh, migrated database, on SQLite and (when configured) on Postgres.

``POLAR_TEST_POSTGRES_URL`` selects the Postgres server (e.g. ``postgresql+psycopg://postgres@127.0.0.1:5432/test``);
without it the Postgres half of every test is skipped. On Postgres each test gets its own randomly named schema,
selected through the URL's ``options=-csearch_path=...`` (so the URL alone, handed to ``db.migrate`` or
``make_engine``, reaches it) and dropped afterwards: parallel runs on the shared database never collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from db.engine import make_engine, make_session_factory
from db.migrate import upgrade
from tests.pg import POSTGRES_URL, postgres_schema, schema_url

DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgres",
        id="postgres",
        marks=pytest.mark.skipif(not POSTGRES_URL, reason="POLAR_TEST_POSTGRES_URL is not set"),
    ),
]


@pytest.fixture(params=DATABASES)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database (a SQLite file, or a fresh Postgres schema)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store' / 'polar.db'}"
        return
    with postgres_schema() as schema:
        yield schema_url(schema)


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """The URL of a database migrated to head."""
    upgrade(empty_database_url)
    return empty_database_url


@pytest.fixture
def db_engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def db_session(db_engine: Engine) -> Iterator[Session]:
    with make_session_factory(db_engine)() as session:
        yield session
