"""Alembic environment: applies db/migrations/versions to one database, described by ``db.models``.

``db.migrate`` is the entry point; it passes the URL as ``config.attributes["url"]`` (a plain
``sqlalchemy.url`` option works too). SQLite gets batch mode (it cannot ALTER most things in place),
foreign-key enforcement off while tables are rebuilt (checked once at the end instead), legacy ALTER TABLE
renames (so the analysis views do not block a rebuild), and real
transactions, so a failed migration leaves the schema as it was on both databases.
"""

from __future__ import annotations

import sqlite3

from alembic import context
from sqlalchemy import URL, Connection, Engine, event, pool

from db.engine import make_engine
from db.models import Base

config = context.config


def _database_url() -> str | URL:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: run migrations through db.migrate, or set sqlalchemy.url")
    return url


def _make_sqlite_transactional(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _driver_autocommit(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # pysqlite opens a transaction only before DML, so DDL would commit statement by statement; taking
        # transaction control from the driver (BEGIN below) makes a migration all-or-nothing.
        dbapi_connection.isolation_level = None
        # Batch mode rebuilds a table (copy, drop, rename); with enforcement on, dropping a referenced table
        # fails or cascades. SQLite only takes this pragma outside a transaction, hence at connect.
        dbapi_connection.execute("PRAGMA foreign_keys=OFF")
        # The final RENAME of a rebuild would otherwise re-check every view (db.views) while the table is being
        # swapped and fail; the views name tables, not their definitions, so they stay valid after the swap.
        dbapi_connection.execute("PRAGMA legacy_alter_table=ON")

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")


def _check_sqlite_foreign_keys(connection: Connection) -> None:
    violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if violations:
        raise RuntimeError(f"migration left rows that break foreign keys (table, rowid, parent, fk): {violations}")


def run_migrations_online() -> None:
    engine = make_engine(_database_url(), poolclass=pool.NullPool)
    is_sqlite = engine.dialect.name == "sqlite"
    if is_sqlite:
        _make_sqlite_transactional(engine)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=Base.metadata,
                render_as_batch=is_sqlite,
                compare_type=True,
            )
            with context.begin_transaction():
                if engine.dialect.name == "postgresql":
                    # Several processes (gateways, workers) may start at once: the first migrates, the others
                    # wait here and then find nothing to do. Released at commit.
                    connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('polar-migrations'))")
                context.run_migrations()
                if is_sqlite:
                    _check_sqlite_foreign_keys(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run them against a database")
run_migrations_online()
