"""Which sampling regime made each trained token: ``trajectories.sampling_spans``.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

Beside ``version_spans``: ``{"start", "end", "temperature", "top_p", "top_k", "min_p", "logprob_semantics",
"greedy"}`` ranges of response positions, one per sampling regime of the chain's calls (a trace may mix a call at
temperature 1.0, one at 0.3 with top_p 0.9 and a greedy one). Captures need no column: each already stores its
``sampling_params`` and ``logprob_semantics``, one regime over its whole output. NULL on rows built before; a
rebuild (``polar trajectories rebuild``) fills it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from db.types import JSONType

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("sampling_spans", JSONType(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("sampling_spans")
