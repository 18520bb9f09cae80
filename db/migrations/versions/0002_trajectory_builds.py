"""Trajectory builds: malformed tool-call counts on captures, build details on trajectories, merge_stats.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Additive only: new columns have defaults (or are nullable), so rows written before this revision stay valid
and a gateway that does not fill ``n_malformed_tool_calls`` yet records 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite only autoincrements an INTEGER PRIMARY KEY.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Batch mode: an in-place ADD COLUMN on both databases (SQLite needs no table rebuild to add a column).
    with op.batch_alter_table("captures") as batch:
        batch.add_column(sa.Column("n_malformed_tool_calls", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("finish_reason", sa.String(32), nullable=True))
        batch.add_column(sa.Column("n_inexact_merges", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("n_malformed_tool_calls", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("filter_reason", sa.String(32), nullable=True))

    op.create_table(
        "merge_stats",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.String(36), nullable=False),
        sa.Column("builder", sa.String(64), nullable=False),
        sa.Column("captures_in", sa.Integer(), nullable=False),
        sa.Column("error_captures", sa.Integer(), nullable=False),
        sa.Column("traces_out", sa.Integer(), nullable=False),
        sa.Column("roots", sa.Integer(), nullable=False),
        sa.Column("exact_merges", sa.Integer(), nullable=False),
        sa.Column("inexact_merges", sa.Integer(), nullable=False),
        sa.Column("breaks", sa.Integer(), nullable=False),
        sa.Column("break_causes", db.types.JSONType(), nullable=False),
        sa.Column("sampled_tokens", sa.Integer(), nullable=False),
        sa.Column("loss_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", db.types.UTCDateTime(), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"], ["rollouts.id"], name=op.f("fk_merge_stats_rollout_id_rollouts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_merge_stats")),
        sa.UniqueConstraint("rollout_id", "builder", name=op.f("uq_merge_stats_rollout_id_builder")),
    )


def downgrade() -> None:
    op.drop_table("merge_stats")
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("filter_reason")
        batch.drop_column("n_malformed_tool_calls")
        batch.drop_column("n_inexact_merges")
        batch.drop_column("finish_reason")
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("n_malformed_tool_calls")
