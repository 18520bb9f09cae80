"""The fleet: ``rollout_artifacts`` (files a later stage needs on any host) and ``gateways`` (live replicas).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

A rollout resumed on another host finds no runtime folder: postrun and evaluate read the agent's diff, the files
the evaluator reads and the harness's logs from ``rollout_artifacts`` (bytes in the row, or a URL under
``POLAR_ARTIFACT_URL``). Gateways register in ``gateways`` and send heartbeats there, so the control API pushes
new weights to every live one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from db.types import UTCDateTime

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"], ["rollouts.id"], name="fk_rollout_artifacts_rollout_id_rollouts", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_rollout_artifacts"),
        sa.UniqueConstraint("rollout_id", "name", name="uq_rollout_artifacts_rollout_id_name"),
    )
    op.create_index("ix_rollout_artifacts_rollout_id", "rollout_artifacts", ["rollout_id"])
    op.create_table(
        "gateways",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
        sa.Column("stopped_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gateways"),
    )
    op.create_index("ix_gateways_heartbeat_at", "gateways", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index("ix_gateways_heartbeat_at", table_name="gateways")
    op.drop_table("gateways")
    op.drop_index("ix_rollout_artifacts_rollout_id", table_name="rollout_artifacts")
    op.drop_table("rollout_artifacts")
