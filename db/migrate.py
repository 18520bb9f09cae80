"""Run the store's Alembic migrations from Python, with no alembic.ini.

The Alembic config is built here, pointing at the ``migrations`` folder beside this module, so migrations run
the same from any working directory and from an installed package. New revisions are written with
``alembic.command.revision(make_config(url), "message", autogenerate=True)`` against an up-to-date database.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, pool

from db.engine import make_engine, normalize_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def make_config(url: str | URL | None = None) -> Config:
    """An Alembic config for this package's migrations, aimed at ``url`` (``None``: for offline queries)."""
    config = Config()
    # Main options go through configparser interpolation, where "%" is special.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if url is not None:
        # An attribute, not the sqlalchemy.url option: URLs often hold "%"-escapes (passwords, options).
        config.attributes["url"] = normalize_url(url)
    return config


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    command.upgrade(make_config(url), revision)


def downgrade(url: str | URL, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` drops every table)."""
    command.downgrade(make_config(url), revision)


def current(url: str | URL) -> str | None:
    """The revision the database at ``url`` is at; ``None`` for a database never migrated."""
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision this code ships; a database at it matches ``db.models``."""
    heads = ScriptDirectory.from_config(make_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"expected one migration head, found {heads}: merge the branches")
    return heads[0]
