"""Migrations and models agree, on SQLite and Postgres: upgrade, compare, downgrade, upgrade again."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from db.engine import make_engine
from db.migrate import current, downgrade, head, upgrade
from db.models import Base

MODEL_TABLES = {
    "weight_versions",
    "tasks",
    "claims",
    "submissions",
    "rollouts",
    "captures",
    "trajectories",
    "merge_stats",
    "evaluations",
    "rollout_artifacts",
    "gateways",
}


def _schema_diff(url: str, metadata: sa.MetaData) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            return compare_metadata(context, metadata)
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_matches_models_and_downgrade_removes_everything(empty_database_url: str) -> None:
    url = empty_database_url
    assert current(url) is None

    upgrade(url)
    assert current(url) == head()
    assert _tables(url) == MODEL_TABLES | {"alembic_version"}
    assert _schema_diff(url, Base.metadata) == []

    downgrade(url, "base")
    assert current(url) is None
    assert _tables(url) == {"alembic_version"}

    upgrade(url)
    assert current(url) == head()
    assert _schema_diff(url, Base.metadata) == []


def test_comparison_notices_a_model_the_migrations_lack(database_url: str) -> None:
    # Guards the test above: an empty diff must mean agreement, not a comparison that sees nothing.
    metadata = sa.MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(metadata)
    sa.Table("captures", metadata, sa.Column("extra", sa.Integer()), extend_existing=True)

    diff = _schema_diff(database_url, metadata)

    assert [(op, column.name) for op, _schema, _table, column in diff] == [("add_column", "extra")]
