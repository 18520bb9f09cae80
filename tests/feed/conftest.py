"""Feed fixtures: a fresh migrated store per test on SQLite and (when configured) Postgres, and synthetic groups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from tests.pg import STORES, migrated_store


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with migrated_store(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def factory(store_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(store_url)
    yield make_session_factory(engine)
    engine.dispose()
