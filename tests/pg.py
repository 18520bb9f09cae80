"""A throw-away Postgres schema for a test, on the server named by POLAR_TEST_POSTGRES_URL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine

POSTGRES_URL = os.environ.get("POLAR_TEST_POSTGRES_URL", "")
needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="POLAR_TEST_POSTGRES_URL is not set")


STORES = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=needs_postgres)]
"""Parameters of a store fixture: SQLite always, Postgres when POLAR_TEST_POSTGRES_URL is set."""


@contextmanager
def migrated_store(kind: str, folder) -> Iterator[str]:
    """The URL of a fresh store migrated to head: a SQLite file in ``folder``, or a throw-away Postgres schema."""
    from db.migrate import upgrade

    if kind == "sqlite":
        url = f"sqlite:///{folder / 'polar.db'}"
        upgrade(url)
        yield url
        return
    with postgres_schema() as schema:
        url = schema_url(schema)
        upgrade(url)
        yield url


@contextmanager
def migrated_factory(kind: str, folder) -> Iterator[sessionmaker[Session]]:
    """A session factory on a fresh migrated store (``migrated_store``), its engine disposed afterwards."""
    from db.engine import make_session_factory

    with migrated_store(kind, folder) as url:
        engine = make_engine(url)
        try:
            yield make_session_factory(engine)
        finally:
            engine.dispose()


def schema_url(schema: str, base: str = "") -> str:
    url = make_url(base or POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@contextmanager
def postgres_schema() -> Iterator[str]:
    """Yields the schema name; it is dropped (with everything in it) afterwards."""
    schema = f"polar_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield schema
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
