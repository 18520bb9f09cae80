"""Engines and sessions for the store, on Postgres (psycopg 3) or SQLite.

``make_engine`` normalises the URL, tunes each database (SQLite: foreign keys on, WAL, a busy timeout;
Postgres: pre-ping so a pooled connection the server dropped is replaced, not handed out) and turns "the
database cannot be reached" into ``polar.errors.StoreError``, which servers map to a 503. Engines connect
lazily: an unreachable database fails on first use, not here.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

from sqlalchemy import URL, CursorResult, Engine, Executable, create_engine, event, exc, make_url
from sqlalchemy.engine.interfaces import ExceptionContext
from sqlalchemy.orm import Session, sessionmaker

from polar.errors import StoreError

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another writer's lock before failing with "database is locked"."""

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def normalize_url(url: str | URL) -> URL:
    """``postgresql://`` and ``postgres://`` select psycopg 3; every other URL is kept as given."""
    if isinstance(url, str):
        for scheme in _POSTGRES_SCHEMES:
            if url.startswith(scheme):
                url = "postgresql+psycopg://" + url[len(scheme) :]
                break
        return make_url(url)
    if url.drivername in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    return url


def make_engine(
    url: str | URL,
    *,
    connect_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
    **engine_kwargs: Any,
) -> Engine:
    """An engine for ``url``; ``engine_kwargs`` go to ``create_engine`` (e.g. ``connect_args``, ``poolclass``).

    A SQLite file's parent folder is created. Connection failures and dropped connections raise
    ``StoreError`` naming the database (the driver's error is its ``__cause__``). Timeouts, when given: on
    Postgres ``connect_timeout`` (whole seconds, at least 2: libpq's rule), the server's ``statement_timeout``
    for every statement, and the wait for a pooled connection; on SQLite ``statement_timeout_s`` is the busy
    timeout (how long a writer waits for another's lock).
    """
    url = normalize_url(url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        engine_kwargs.setdefault("pool_pre_ping", True)
        if connect_timeout_s is not None:
            connect_args = dict(engine_kwargs.pop("connect_args", {}))
            connect_args.setdefault("connect_timeout", max(2, math.ceil(connect_timeout_s)))
            engine_kwargs["connect_args"] = connect_args
        if statement_timeout_s is not None and engine_kwargs.get("poolclass") is None:
            engine_kwargs.setdefault("pool_timeout", statement_timeout_s)
    elif backend == "sqlite":
        _create_sqlite_folder(url)

    engine = create_engine(url, **engine_kwargs)
    if backend == "sqlite":
        busy_ms = SQLITE_BUSY_TIMEOUT_MS if statement_timeout_s is None else int(statement_timeout_s * 1000)
        event.listen(engine, "connect", partial(_configure_sqlite_connection, busy_ms=busy_ms))
    elif backend == "postgresql" and statement_timeout_s is not None:
        event.listen(engine, "connect", partial(_set_statement_timeout, ms=int(statement_timeout_s * 1000)))
    event.listen(engine, "handle_error", _store_error_on_unreachable(url), retval=True)
    return engine


def rows_matched(db: Session, statement: Executable) -> int:
    """Execute an UPDATE or DELETE in ``db``; returns how many rows its WHERE matched."""
    result = cast(CursorResult[Any], db.execute(statement))
    return result.rowcount


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit (rows are handed to other layers)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session in one transaction: committed when the block exits, rolled back if it raises."""
    with factory() as session, session.begin():
        yield session


def describe_database(url: URL) -> str:
    """Where ``url`` points, for messages: host, port and database, or the SQLite file (never the password)."""
    if url.get_backend_name() == "sqlite":
        return f"SQLite database {url.database or ':memory:'}"
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    return f"{url.get_backend_name()} database {url.database!r} at {host}{port}"


def _create_sqlite_folder(url: URL) -> None:
    database = url.database
    # In-memory databases and sqlite "file:" URIs name no plain path to prepare.
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _set_statement_timeout(dbapi_connection: Any, _record: object, *, ms: int) -> None:
    # A session-level SET (committed at once), so it holds for every later transaction on this connection.
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET statement_timeout = {int(ms)}")
    dbapi_connection.commit()


def _configure_sqlite_connection(
    dbapi_connection: sqlite3.Connection, _record: object, *, busy_ms: int = SQLITE_BUSY_TIMEOUT_MS
) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # Off by default in SQLite; without it foreign keys and ON DELETE CASCADE are silently ignored.
        cursor.execute("PRAGMA foreign_keys=ON")
        # WAL lets readers proceed while one writer commits (the gateway writes while the API reads).
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    finally:
        cursor.close()


def _store_error_on_unreachable(url: URL) -> Callable[[ExceptionContext], BaseException | None]:
    where = describe_database(url)

    def translate(context: ExceptionContext) -> BaseException | None:
        # Pre-ping probes a pooled connection and reconnects when it is dead; translating there would turn a
        # recoverable stale connection into a failure.
        if context.is_pre_ping:
            return None
        failed_to_connect = context.connection is None and isinstance(
            context.sqlalchemy_exception, exc.OperationalError
        )
        if not (failed_to_connect or context.is_disconnect):
            return None
        # The driver's first line says why (refused, unknown host, bad password); the rest is hints.
        detail = str(context.original_exception).strip()
        reason = detail.splitlines()[0] if detail else type(context.original_exception).__name__
        verb = "cannot connect to" if failed_to_connect else "lost the connection to"
        return StoreError(f"{verb} the store ({where}): {reason}")

    return translate
