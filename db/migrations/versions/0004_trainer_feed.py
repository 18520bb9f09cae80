"""Trainer feed: claims of complete groups, task completion times, dispatch and callbacks.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

A ``claims`` row is one trainer's lease on a batch of groups (a group is a task whose samples all finished);
``tasks.claim_id`` points at the claim that holds or consumed the group. ``tasks.finished_at`` is when the last
sample finished, ``tasks.dispatched_at`` when the control API started its rollouts (admission control holds a
task back while it is too far ahead of the trainer), ``tasks.callback_url``/``callback_state`` drive the
completion webhook, and ``rollouts.dispatch_id`` names the Prefect flow run created for a rollout.
Additive only; every new column is nullable.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("trainer", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("n_groups", sa.Integer(), nullable=False),
        sa.Column("n_trajectories", sa.Integer(), nullable=False),
        sa.Column("created_at", db.types.UTCDateTime(), server_default=sa.func.now(), nullable=False),
        sa.Column("lease_expires_at", db.types.UTCDateTime(), nullable=False),
        sa.Column("finished_at", db.types.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_claims")),
    )
    op.create_index(op.f("ix_claims_status"), "claims", ["status"])
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("claim_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("finished_at", db.types.UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("dispatched_at", db.types.UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("callback_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("callback_state", db.types.JSONType(), nullable=True))
        batch.create_index(batch.f("ix_tasks_claim_id"), ["claim_id"])
        batch.create_foreign_key(batch.f("fk_tasks_claim_id_claims"), "claims", ["claim_id"], ["id"])
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("dispatch_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("dispatch_id")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_constraint(batch.f("fk_tasks_claim_id_claims"), type_="foreignkey")
        batch.drop_index(batch.f("ix_tasks_claim_id"))
        batch.drop_column("callback_state")
        batch.drop_column("callback_url")
        batch.drop_column("dispatched_at")
        batch.drop_column("finished_at")
        batch.drop_column("claim_id")
    op.drop_index(op.f("ix_claims_status"), table_name="claims")
    op.drop_table("claims")
