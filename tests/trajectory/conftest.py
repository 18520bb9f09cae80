"""Store fixtures for the trajectory tests: one migrated database per module and backend (SQLite, and Postgres
when POLAR_TEST_POSTGRES_URL is set). Tests share it, so each works on rollouts of its own and filters by them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from tests.pg import STORES, migrated_store


@pytest.fixture(scope="module", params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_store(request.param, tmp_path_factory.mktemp("store")) as url:
        yield url


@pytest.fixture(scope="module")
def session_factory(store_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(store_url)
    yield make_session_factory(engine)
    engine.dispose()
