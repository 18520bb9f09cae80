"""Engines, sessions and URL handling."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from db_factories import add_rollout
from sqlalchemy.orm import Session

from db.engine import make_engine, make_session_factory, normalize_url, session_scope
from db.models import Rollout
from polar.errors import StoreError


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@db:5432/polar", "postgresql+psycopg://u:p@db:5432/polar"),
        ("postgres://u@db/polar", "postgresql+psycopg://u@db/polar"),
        ("postgresql+psycopg://u@db/polar", "postgresql+psycopg://u@db/polar"),
        ("sqlite:///data/polar.db", "sqlite:///data/polar.db"),
    ],
)
def test_normalize_url_selects_psycopg(given: str, expected: str) -> None:
    assert normalize_url(given).render_as_string(hide_password=False) == expected
    assert normalize_url(sa.make_url(given.replace("postgres://", "postgresql://"))).drivername == (
        sa.make_url(expected).drivername
    )


def test_unreachable_postgres_raises_store_error_naming_the_host() -> None:
    engine = make_engine("postgresql://postgres:secret@127.0.0.1:1/test")  # connects lazily: no error yet
    try:
        with pytest.raises(StoreError, match=r"127\.0\.0\.1:1") as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    assert "cannot connect" in caught.value.message
    assert "secret" not in caught.value.message
    assert caught.value.status_code == 503


def test_unopenable_sqlite_file_raises_store_error(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    engine = make_engine(f"sqlite:///{folder}")  # a folder is not a database file
    try:
        with pytest.raises(StoreError, match="a-folder"), engine.connect():
            pass
    finally:
        engine.dispose()


def test_sqlite_gets_its_folder_and_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "deeper" / "polar.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            pragma = {
                name: connection.exec_driver_sql(f"PRAGMA {name}").scalar_one()
                for name in ("foreign_keys", "journal_mode", "busy_timeout")
            }
    finally:
        engine.dispose()
    assert path.exists()
    assert pragma == {"foreign_keys": 1, "journal_mode": "wal", "busy_timeout": 30_000}


def test_session_scope_commits(db_engine: sa.Engine) -> None:
    factory = make_session_factory(db_engine)
    with session_scope(factory) as session:
        rollout_id = add_rollout(session).id

    with Session(db_engine) as fresh:
        assert fresh.get(Rollout, rollout_id) is not None


def test_session_scope_rolls_back_on_error(db_engine: sa.Engine) -> None:
    factory = make_session_factory(db_engine)
    with pytest.raises(RuntimeError, match="boom"), session_scope(factory) as session:
        rollout_id = add_rollout(session).id
        raise RuntimeError("boom")

    with Session(db_engine) as fresh:
        assert fresh.get(Rollout, rollout_id) is None


def test_committed_rows_stay_readable(db_engine: sa.Engine) -> None:
    with session_scope(make_session_factory(db_engine)) as session:
        rollout = add_rollout(session, error="crashed")
    assert rollout.error == "crashed"  # no reload after commit, the session is closed
