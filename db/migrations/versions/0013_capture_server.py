"""Which inference server made a capture: ``captures.server``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

With several inference servers (``POLAR_BACKEND_URL`` lists a fleet), a session sticks to one server and moves
to another when that one fails; each capture records the server that produced it, so a move is visible in the
captures of the session. Null for captures made with one server, and for every capture made before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("captures", sa.Column("server", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("server")
