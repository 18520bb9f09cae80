"""Which runner dispatches a task: ``tasks.dispatcher``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

A task's rollouts are started by exactly one runner (``polar run``, ``polar demo``, a batch or SFT flow run, a
control API replica); the runner is recorded here, with ``dispatched_at``, by a conditional update that only a
task without one matches (``polar.rollout.dispatcher``). Tasks dispatched before this revision keep a NULL
runner; those already started (``dispatched_at`` set, or a rollout past PENDING) are marked ``legacy`` so no
runner takes them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("dispatcher", sa.String(128), nullable=True))
    # Plain SQL: the correlated EXISTS reads the same on SQLite and Postgres.
    op.execute(
        "UPDATE tasks SET dispatcher = 'legacy', dispatched_at = COALESCE(dispatched_at, created_at) "
        "WHERE dispatched_at IS NOT NULL OR EXISTS (SELECT 1 FROM rollouts WHERE rollouts.task_id = tasks.id "
        "AND (rollouts.flow_run_id IS NOT NULL OR rollouts.status <> 'PENDING'))"
    )


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("dispatcher")
