"""Top-k logprobs and MoE routed experts on captures, stored compactly and only where a session asked.

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-04

``top_k`` / ``top_ids`` (int32 bytes) / ``top_logprobs`` (float32 or float16 bytes) per sampled token, and
``experts_start`` / ``experts_layers`` / ``experts_k`` / ``routed_experts`` (uint8 or uint16 bytes per position,
layer and k) for the positions a call added to its parent's. All NULL for captures made without them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("top_k", sa.Integer()),
    ("top_ids", sa.LargeBinary()),
    ("top_logprobs", sa.LargeBinary()),
    ("experts_start", sa.Integer()),
    ("experts_layers", sa.Integer()),
    ("experts_k", sa.Integer()),
    ("routed_experts", sa.LargeBinary()),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("captures", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("captures") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
