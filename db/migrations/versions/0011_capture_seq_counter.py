"""A per-rollout capture sequence counter: ``rollouts.next_capture_seq``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

Gateway processes (one host or many) assign ``captures.seq`` by incrementing this counter in the transaction
that inserts the captures (``UPDATE ... RETURNING``): the row lock orders concurrent writers, so no
``max(seq)`` read and no retry on a taken number. Existing rollouts start after their highest seq.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("next_capture_seq", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        sa.text(
            "UPDATE rollouts SET next_capture_seq = COALESCE("
            "(SELECT MAX(captures.seq) + 1 FROM captures WHERE captures.rollout_id = rollouts.id), 0)"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("next_capture_seq")
