"""Initial schema: weight versions, tasks, rollouts, captures, trajectories, evaluations.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Statuses are plain VARCHAR(16) columns (the models' enums are validated in Python), so this revision does
not depend on the enum classes of the day.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

import db.types

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite only autoincrements an INTEGER PRIMARY KEY.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _created_at() -> sa.Column[Any]:
    return sa.Column("created_at", db.types.UTCDateTime(), server_default=sa.func.now(), nullable=False)


def _rollout_id() -> sa.Column[Any]:
    return sa.Column("rollout_id", sa.String(36), nullable=False)


def _rollout_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["rollout_id"], ["rollouts.id"], name=op.f(f"fk_{table}_rollout_id_rollouts"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "weight_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        _created_at(),
        sa.Column("checkpoint_uri", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_weight_versions")),
        sa.UniqueConstraint("version", name=op.f("uq_weight_versions_version")),
    )

    op.create_table(
        "tasks",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("instruction", sa.Text(), nullable=False),
        sa.Column("harness", db.types.JSONType(), nullable=False),
        sa.Column("runtime", db.types.JSONType(), nullable=False),
        sa.Column("evaluator", db.types.JSONType(), nullable=False),
        sa.Column("builder", sa.String(64), server_default="prefix_merge", nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Double(), nullable=True),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("metadata", db.types.JSONType(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _created_at(),
        sa.Column("updated_at", db.types.UTCDateTime(), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    op.create_index(op.f("ix_tasks_status"), "tasks", ["status"])

    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("task_id", sa.String(36), nullable=True),
        sa.Column("sample_index", sa.Integer(), server_default="0", nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(32), nullable=True),
        sa.Column("stage_results", db.types.JSONType(), nullable=False),
        sa.Column("stage_timings", db.types.JSONType(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("weight_version_min", sa.String(128), nullable=True),
        sa.Column("weight_version_max", sa.String(128), nullable=True),
        sa.Column("session_token_hash", sa.String(64), nullable=True),
        sa.Column("policy", db.types.JSONType(), nullable=True),
        _created_at(),
        sa.Column("started_at", db.types.UTCDateTime(), nullable=True),
        sa.Column("finished_at", db.types.UTCDateTime(), nullable=True),
        sa.Column("closed_at", db.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_rollouts_task_id_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
        sa.UniqueConstraint("session_token_hash", name=op.f("uq_rollouts_session_token_hash")),
    )
    op.create_index(op.f("ix_rollouts_status"), "rollouts", ["status"])
    op.create_index(op.f("ix_rollouts_task_id"), "rollouts", ["task_id"])

    op.create_table(
        "captures",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        _rollout_id(),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.String(32), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("request_json", db.types.JSONType(), nullable=False),
        sa.Column("response_json", db.types.JSONType(), nullable=True),
        sa.Column("parent_id", BIG_ID, nullable=True),
        sa.Column("prefix_len", sa.Integer(), server_default="0", nullable=False),
        sa.Column("prompt_delta_ids", db.types.IntArray(), nullable=False),
        sa.Column("output_ids", db.types.IntArray(), nullable=False),
        sa.Column("output_logprobs", db.types.FloatArray(), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("matched_stop", db.types.JSONType(), nullable=True),
        sa.Column("weight_version", sa.String(128), nullable=True),
        sa.Column("version_spans", db.types.JSONType(), nullable=False),
        sa.Column("sampling_params", db.types.JSONType(), nullable=False),
        sa.Column("render_mode", sa.String(16), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("logprob_semantics", sa.String(32), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_s", sa.Double(), nullable=True),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("n_prompt", sa.Integer(), nullable=False),
        sa.Column("n_prompt_delta", sa.Integer(), nullable=False),
        sa.Column("n_output", sa.Integer(), nullable=False),
        _created_at(),
        sa.ForeignKeyConstraint(["parent_id"], ["captures.id"], name=op.f("fk_captures_parent_id_captures")),
        _rollout_fk("captures"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_captures")),
        sa.UniqueConstraint("rollout_id", "seq", name=op.f("uq_captures_rollout_id_seq")),
    )
    op.create_index(op.f("ix_captures_parent_id"), "captures", ["parent_id"])

    op.create_table(
        "trajectories",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        _rollout_id(),
        sa.Column("builder", sa.String(64), nullable=False),
        sa.Column("chain_index", sa.Integer(), nullable=False),
        sa.Column("capture_ids", db.types.JSONType(), nullable=False),
        sa.Column("prompt_ids", db.types.IntArray(), nullable=False),
        sa.Column("response_ids", db.types.IntArray(), nullable=False),
        sa.Column("loss_mask", db.types.IntArray(), nullable=False),
        sa.Column("response_logprobs", db.types.FloatArray(), nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("weight_version_min", sa.String(128), nullable=True),
        sa.Column("weight_version_max", sa.String(128), nullable=True),
        sa.Column("version_spans", db.types.JSONType(), nullable=False),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.Column("n_prompt", sa.Integer(), nullable=False),
        sa.Column("n_response", sa.Integer(), nullable=False),
        sa.Column("n_loss_tokens", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("consumed_by", sa.String(128), nullable=True),
        sa.Column("consumed_at", db.types.UTCDateTime(), nullable=True),
        _created_at(),
        _rollout_fk("trajectories"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
        sa.UniqueConstraint(
            "rollout_id", "builder", "chain_index", name=op.f("uq_trajectories_rollout_id_builder_chain_index")
        ),
    )

    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        _rollout_id(),
        sa.Column("evaluator", sa.String(64), nullable=False),
        sa.Column("reward", sa.Double(), nullable=False),
        sa.Column("details", db.types.JSONType(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        _created_at(),
        _rollout_fk("evaluations"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
    )
    op.create_index(op.f("ix_evaluations_rollout_id"), "evaluations", ["rollout_id"])


def downgrade() -> None:
    # Children before parents; dropping a table drops its indexes and constraints.
    for table in ("evaluations", "trajectories", "captures", "rollouts", "tasks", "weight_versions"):
        op.drop_table(table)
