"""How the gateway admitted each call: ``captures.admission`` and ``captures.admission_cause``.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

``admission`` is ``root`` (no earlier call explains the call), ``match`` (it extends a committed call token for
token) or ``unresolved`` (its history holds assistant content no capture of the session produced there: the chain
is poisoned from it on, kept and never trained). ``admission_cause`` says why a root after the session's first
call started (``tools_changed``, ``history_edited``, ``sub_agent``, ...). Both are NULL for captures made
before. ``merge_stats`` gains ``untrained_tokens`` (sampled tokens not trained, by reason), ``trainable_tokens``
(loss tokens after the training filter) and ``root_causes``; ``trajectories.kept`` marks the chain the harness
kept. (The capture status ``UNACKNOWLEDGED`` needs no
schema change: statuses are plain strings.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from db.types import JSONType

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("captures", sa.Column("admission", sa.String(16), nullable=True))
    op.add_column("captures", sa.Column("admission_cause", sa.String(32), nullable=True))
    op.add_column("merge_stats", sa.Column("untrained_tokens", JSONType(), nullable=True))
    op.add_column("merge_stats", sa.Column("trainable_tokens", sa.Integer(), nullable=True))
    op.add_column("merge_stats", sa.Column("root_causes", JSONType(), nullable=True))
    op.add_column("trajectories", sa.Column("kept", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("kept")
    with op.batch_alter_table("merge_stats") as batch:
        batch.drop_column("root_causes")
        batch.drop_column("trainable_tokens")
        batch.drop_column("untrained_tokens")
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("admission_cause")
        batch.drop_column("admission")
