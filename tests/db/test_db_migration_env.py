"""The migration environment: a failed migration changes nothing; table rebuilds (SQLite batch mode) keep rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from db_factories import CaptureTreeBuilder, add_rollout
from sqlalchemy.orm import Session

from db.capture_tree import full_prompt_ids
from db.engine import make_engine
from db.migrate import MIGRATIONS_DIR, current, head, make_config
from db.models import Capture

BROKEN_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "extra"
down_revision = "{head}"


def upgrade():
    op.create_table("scratch", sa.Column("id", sa.Integer, primary_key=True))
    with op.batch_alter_table("captures") as batch:
        batch.add_column(sa.Column("scratch_note", sa.Text))
    op.execute("SELECT * FROM no_such_table")
"""

REBUILD_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "extra"
down_revision = "{head}"


def upgrade():
    # On SQLite: a full copy-and-rename of captures, a table both referenced and self-referencing.
    # Postgres alters in place.
    recreate = "always" if op.get_bind().dialect.name == "sqlite" else "auto"
    with op.batch_alter_table("captures", recreate=recreate) as batch:
        batch.add_column(sa.Column("scratch_note", sa.Text))
"""


def _apply_extra_revision(url: str, tmp_path: Path, source: str) -> None:
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    # The extra revision goes on top of whatever this code ships, so the test survives new revisions.
    (scripts / "versions" / "9999_extra.py").write_text(source.replace("{head}", head()))
    config = make_config(url)
    config.set_main_option("script_location", str(scripts))
    command.upgrade(config, "head")


def _columns(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_a_failed_migration_leaves_the_schema_as_it_was(database_url: str, tmp_path: Path) -> None:
    with pytest.raises(sa.exc.DBAPIError, match="no_such_table"):
        _apply_extra_revision(database_url, tmp_path, BROKEN_REVISION)

    assert current(database_url) == head()
    engine = make_engine(database_url)
    try:
        assert "scratch" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    assert "scratch_note" not in _columns(database_url, "captures")


def test_rebuilding_a_table_keeps_its_rows_and_foreign_keys(database_url: str, tmp_path: Path) -> None:
    engine = make_engine(database_url)
    with Session(engine) as session:
        tree = CaptureTreeBuilder(session, add_rollout(session))
        root = tree.add([1, 2], [3])
        child = tree.add([1, 2, 3, 4], [5], parent=root)
        session.commit()
        expected = tree.full_prompts[child.id]
    engine.dispose()

    _apply_extra_revision(database_url, tmp_path, REBUILD_REVISION)

    assert current(database_url) == "extra"
    assert "scratch_note" in _columns(database_url, "captures")
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            assert full_prompt_ids(session, session.get_one(Capture, child.id)) == expected
            # The analysis views over the rebuilt table still answer.
            assert session.execute(sa.text("SELECT SUM(captures) FROM token_counts")).scalar() == 2
            # Enforcement is back on for ordinary connections after the rebuild.
            with pytest.raises(sa.exc.IntegrityError):
                session.execute(sa.update(Capture).where(Capture.id == child.id).values(parent_id=10**9))
    finally:
        engine.dispose()
