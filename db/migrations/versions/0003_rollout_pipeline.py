"""Rollout pipeline: task names and agent budgets, rollout deadlines and heartbeats.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

Additive only, every new column nullable: ``tasks.name`` (a caller's label), ``tasks.agent_timeout_s`` (the
agent budget, which starts when the harness launches), ``rollouts.deadline_at`` (the shared deadline of init
and run, armed when a flow claims the rollout) and ``rollouts.heartbeat_at`` (last sign of life of the flow
that owns the rollout; the retry flow takes over rollouts whose heartbeat went stale).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("name", sa.String(128), nullable=True))
        batch.add_column(sa.Column("agent_timeout_s", sa.Double(), nullable=True))
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("deadline_at", db.types.UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", db.types.UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("deadline_at")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("agent_timeout_s")
        batch.drop_column("name")
