"""Chain roles: trajectories labelled main / sub_agent / compaction / title / other with the call they came from,
merge statistics by role and by split cause, per-task builder options.

Revision ID: 0009
Revises: 0006
Create Date: 2026-12-05

Additive columns: ``tasks.builder_options`` (JSON, NULL: defaults), ``trajectories.role`` (default ``main``),
``trajectories.source_capture_id``, ``trajectories.compacted`` (default false), ``merge_stats.roots_by_role``
(JSON). Views: ``merge_ratio`` is replaced by one with chain starts by role and splits by cause (its earlier
columns unchanged), and ``trajectory_roles`` is new (``db.views`` documents both). The SQL is frozen here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("main", "sub_agent", "compaction", "title", "other")
CAUSES = ("branch", "compaction", "prompt_rewritten", "parent_failed", "reply_not_found", "no_end_of_turn_id")

_MERGE_RATIO_0005 = """
SELECT {harness} AS harness, m.builder, COUNT(*) AS rollouts,
  SUM(m.captures_in) AS captures_in, SUM(m.error_captures) AS error_captures, SUM(m.traces_out) AS traces_out,
  CAST(SUM(m.captures_in - m.error_captures) AS DOUBLE PRECISION) / NULLIF(SUM(m.traces_out), 0) AS merge_ratio,
  SUM(m.exact_merges) AS exact_merges, SUM(m.inexact_merges) AS inexact_merges,
  CAST(SUM(m.exact_merges) AS DOUBLE PRECISION) / NULLIF(SUM(m.exact_merges + m.inexact_merges), 0) AS exact_rate,
  SUM(m.breaks) AS breaks, SUM(m.sampled_tokens) AS sampled_tokens, SUM(m.loss_tokens) AS loss_tokens{extra}
FROM merge_stats m JOIN rollouts r ON r.id = m.rollout_id LEFT JOIN tasks t ON t.id = r.task_id
GROUP BY {harness}, m.builder"""


def _views(text: Callable[[str, str], str], number: Callable[[str, str], str]) -> dict[str, str]:
    harness = text("t.harness", "name")
    extra = "".join(
        f",\n  COALESCE(SUM({number('m.roots_by_role', role)}), 0) AS {role}_roots" for role in ROLES
    ) + "".join(f",\n  COALESCE(SUM({number('m.break_causes', cause)}), 0) AS {cause}_splits" for cause in CAUSES)
    return {
        "merge_ratio": _MERGE_RATIO_0005.format(harness=harness, extra=extra),
        "trajectory_roles": f"""
SELECT {harness} AS harness, j.builder, j.role, j.compacted, COUNT(*) AS trajectories,
  COUNT(DISTINCT j.rollout_id) AS rollouts, SUM(j.turn_count) AS captures, SUM(j.n_response) AS response_tokens,
  SUM(j.n_loss_tokens) AS loss_tokens, SUM(CASE WHEN j.n_loss_tokens > 0 THEN 1 ELSE 0 END) AS trainable,
  SUM(CASE WHEN j.source_capture_id IS NOT NULL THEN 1 ELSE 0 END) AS linked, AVG(j.reward) AS mean_reward
FROM trajectories j JOIN rollouts r ON r.id = j.rollout_id LEFT JOIN tasks t ON t.id = r.task_id
GROUP BY {harness}, j.builder, j.role, j.compacted""",
    }


def _dialect_views() -> tuple[dict[str, str], str]:
    if op.get_bind().dialect.name == "postgresql":

        def text(column: str, path: str) -> str:
            return f"({column} #>> '{{{','.join(path.split('.'))}}}')"

        def number(column: str, path: str) -> str:
            return f"CAST({text(column, path)} AS DOUBLE PRECISION)"

    else:

        def text(column: str, path: str) -> str:
            return f"json_extract({column}, '$.{path}')"

        def number(column: str, path: str) -> str:
            return f"CAST({text(column, path)} AS REAL)"

    return _views(text, number), _MERGE_RATIO_0005.format(harness=text("t.harness", "name"), extra="")


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("builder_options", db.types.JSONType(), nullable=True))
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("role", sa.String(16), server_default="main", nullable=False))
        batch.add_column(sa.Column("source_capture_id", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("compacted", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("merge_stats") as batch:
        batch.add_column(sa.Column("roots_by_role", db.types.JSONType(), nullable=True))
    views, _ = _dialect_views()
    op.execute("DROP VIEW IF EXISTS merge_ratio")
    for name, sql in views.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    _, merge_ratio = _dialect_views()
    op.execute("DROP VIEW IF EXISTS trajectory_roles")
    op.execute("DROP VIEW IF EXISTS merge_ratio")
    with op.batch_alter_table("merge_stats") as batch:
        batch.drop_column("roots_by_role")
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("compacted")
        batch.drop_column("source_capture_id")
        batch.drop_column("role")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("builder_options")
    op.execute(f"CREATE VIEW merge_ratio AS {merge_ratio}")
