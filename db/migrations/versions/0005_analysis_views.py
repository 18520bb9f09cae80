"""Analysis views: rollout facts, rewards by harness/task/version, token counts, merge ratio, stage latencies,
failure causes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04

Views only, no table changes; their columns and example queries are documented in ``db.views``. JSON is read
with each database's own operators, so a view's SQL differs between Postgres and SQLite while its columns are the
same. The SQL is frozen here: a later change to a view ships a revision that replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STAGES = ("init", "run", "postrun", "evaluate")


def _sql(text: Callable[[str, str], str], number: Callable[[str, str], str]) -> dict[str, str]:
    """The views, given how to read a JSON path as text (``text``) and as a number (``number``)."""
    stage_columns = ",\n".join(f"  {number('r.stage_timings', f'{s}.duration_s')} AS {s}_s" for s in STAGES)
    return {
        "rollout_facts": f"""
SELECT r.id AS rollout_id, r.task_id, t.name AS task_name, {text("t.harness", "name")} AS harness,
  t.builder, r.sample_index, r.status, r.reward, r.attempt,
  r.weight_version_min, r.weight_version_max,
  (SELECT MIN(w.id) FROM weight_versions w WHERE w.version = r.weight_version_min) AS version_id,
  r.created_at, r.finished_at,
{stage_columns},
  {text("r.stage_results", "failure.stage")} AS failed_stage,
  r.error
FROM rollouts r LEFT JOIN tasks t ON t.id = r.task_id""",
        "rewards_by_harness_task_version": """
SELECT harness, task_name, weight_version_min AS weight_version, MIN(version_id) AS version_id,
  COUNT(*) AS rollouts, COUNT(reward) AS rewarded, AVG(reward) AS mean_reward,
  SUM(CASE WHEN reward >= 1 THEN 1 ELSE 0 END) AS solved,
  MIN(created_at) AS first_at, MAX(created_at) AS last_at
FROM rollout_facts WHERE status IN ('COMPLETED', 'ERROR', 'TIMEOUT')
GROUP BY harness, task_name, weight_version_min""",
        "token_counts": f"""
SELECT r.task_id, t.name AS task_name, {text("t.harness", "name")} AS harness, r.id AS rollout_id,
  COUNT(c.id) AS captures, COALESCE(SUM(c.n_prompt), 0) AS prompt_tokens,
  COALESCE(SUM(c.n_prompt_delta), 0) AS prompt_delta_tokens, COALESCE(SUM(c.n_output), 0) AS output_tokens
FROM rollouts r LEFT JOIN tasks t ON t.id = r.task_id LEFT JOIN captures c ON c.rollout_id = r.id
GROUP BY r.task_id, t.name, {text("t.harness", "name")}, r.id""",
        "merge_ratio": f"""
SELECT {text("t.harness", "name")} AS harness, m.builder, COUNT(*) AS rollouts,
  SUM(m.captures_in) AS captures_in, SUM(m.error_captures) AS error_captures, SUM(m.traces_out) AS traces_out,
  CAST(SUM(m.captures_in - m.error_captures) AS DOUBLE PRECISION) / NULLIF(SUM(m.traces_out), 0) AS merge_ratio,
  SUM(m.exact_merges) AS exact_merges, SUM(m.inexact_merges) AS inexact_merges,
  CAST(SUM(m.exact_merges) AS DOUBLE PRECISION) / NULLIF(SUM(m.exact_merges + m.inexact_merges), 0) AS exact_rate,
  SUM(m.breaks) AS breaks, SUM(m.sampled_tokens) AS sampled_tokens, SUM(m.loss_tokens) AS loss_tokens
FROM merge_stats m JOIN rollouts r ON r.id = m.rollout_id LEFT JOIN tasks t ON t.id = r.task_id
GROUP BY {text("t.harness", "name")}, m.builder""",
        "stage_latencies": """
SELECT harness, COUNT(*) AS rollouts,
  AVG(init_s) AS init_mean_s, AVG(run_s) AS run_mean_s, AVG(postrun_s) AS postrun_mean_s,
  AVG(evaluate_s) AS evaluate_mean_s, MAX(init_s) AS init_max_s, MAX(run_s) AS run_max_s,
  MAX(postrun_s) AS postrun_max_s, MAX(evaluate_s) AS evaluate_max_s
FROM rollout_facts GROUP BY harness""",
        "failure_causes": """
SELECT harness, status, COALESCE(failed_stage, '-') AS failed_stage,
  COALESCE(SUBSTR(error, 1, 120), '(no error text)') AS cause, COUNT(*) AS rollouts
FROM rollout_facts WHERE status IN ('ERROR', 'TIMEOUT', 'CANCELLED')
GROUP BY harness, status, COALESCE(failed_stage, '-'), COALESCE(SUBSTR(error, 1, 120), '(no error text)')""",
    }


def _postgres() -> dict[str, str]:
    def text(column: str, path: str) -> str:
        return f"({column} #>> '{{{','.join(path.split('.'))}}}')"

    def number(column: str, path: str) -> str:
        return f"CAST({text(column, path)} AS DOUBLE PRECISION)"

    return _sql(text, number)


def _sqlite() -> dict[str, str]:
    def text(column: str, path: str) -> str:
        return f"json_extract({column}, '$.{path}')"

    def number(column: str, path: str) -> str:
        return f"CAST({text(column, path)} AS REAL)"

    return _sql(text, number)


def upgrade() -> None:
    views = _postgres() if op.get_bind().dialect.name == "postgresql" else _sqlite()
    for name, sql in views.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in reversed(list(_sqlite())):
        op.execute(f"DROP VIEW IF EXISTS {name}")
