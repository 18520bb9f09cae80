"""A gateway announces its drain: ``gateways.draining_at``.

Revision ID: 0019
Revises: 0017
Create Date: 2026-12-05

A replica that begins shutting down (SIGTERM, Ctrl-C) writes ``draining_at`` while it finishes the calls it holds;
the live view shows it DRAINING from that row instead of guessing from a scrape that no longer answers. A restart
(``register``) clears it. NULL for replicas that never drained.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from db.types import UTCDateTime

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gateways", sa.Column("draining_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateways") as batch:
        batch.drop_column("draining_at")
