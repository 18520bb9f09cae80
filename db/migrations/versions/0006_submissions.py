"""Idempotent task submission: the ``submissions`` table of ``Idempotency-Key``s.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

One row per ``POST /v1/tasks`` that carried an ``Idempotency-Key``: the key, the SHA-256 of the batch it
submitted, and the ids of the tasks it created. Additive only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "submissions",
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_sha256", sa.String(64), nullable=False),
        sa.Column("task_ids", db.types.JSONType(), nullable=False),
        sa.Column("created_at", db.types.UTCDateTime(), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_submissions")),
    )


def downgrade() -> None:
    op.drop_table("submissions")
