"""Scripted captures: ``captures.scripted`` and ``trajectories.scripted``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

A capture made by a scripted gateway policy (tests, demos) holds replies no model sampled. It is marked, the
training filter zeroes every trajectory holding one, and exports and the trajectory listing leave those out
unless asked (``include_scripted``). Existing captures whose backend is ``scripted`` are marked here; existing
trajectories are marked when they are next rebuilt (``polar trajectories rebuild``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("captures", sa.Column("scripted", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("trajectories", sa.Column("scripted", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(sa.text("UPDATE captures SET scripted = :yes WHERE backend = 'scripted'").bindparams(yes=True))


def downgrade() -> None:
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("scripted")
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("scripted")
