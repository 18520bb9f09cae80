"""Why a call asked to extend its parent's ids was rendered whole: ``captures.fallback_reason``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

``render_mode`` says ``canonical`` when the gateway rendered a request's whole conversation instead of extending
its parent's sampled ids (append mode); the reason it gave (no earlier call extended, a chat format that cannot
extend the ids exactly there) was computed and logged only. NULL where append mode applied, in canonical mode by
choice, on a session's first call, and on rows written before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("captures", sa.Column("fallback_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("fallback_reason")
