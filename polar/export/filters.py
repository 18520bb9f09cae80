"""Which trajectories an export (or an analysis) takes: filters on task, harness, reward, status, version, date,
and the SFT acceptance rule.

``apply`` adds the filters to a query that already joins ``Trajectory``, ``Rollout`` and ``Task``. The harness
name lives in the task's JSON ``harness`` column; ``harness_name`` extracts it in the dialect at hand.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

from db.models import Rollout, Task, Trajectory
from polar.trajectory.prefix_merge import NAME as DEFAULT_BUILDER

# Any select: the filters add WHERE clauses and keep the columns (and so the row type) as they are.
Query = TypeVar("Query", bound="sa.Select[*tuple[Any, ...]]")


class Acceptance(BaseModel):
    """What an SFT run keeps: a rewarded, error-free, untruncated conversation."""

    model_config = ConfigDict(extra="forbid")
    min_reward: float = Field(default=1.0, description="reward at least this")
    no_errors: bool = Field(default=True, description="only COMPLETED rollouts the training filter left alone")
    not_truncated: bool = Field(default=True, description="drop conversations whose last reply hit max tokens")
    include_scripted: bool = Field(
        default=False, description="also conversations a scripted policy wrote (tests, demos); never by default"
    )


class ExportFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_ids: list[str] | None = None
    task_name: str | None = None
    rollout_id: str | None = None
    harness: str | None = None
    builder: str | None = Field(default=None, description="default: each task's own builder")
    all_builders: bool = Field(default=False, description="with no builder given, every builder's trajectories")
    min_reward: float | None = None
    max_reward: float | None = None
    status: list[str] | None = Field(default=None, description="trajectory statuses, e.g. COMPLETED, TIMEOUT")
    weight_version: str | None = Field(default=None, description="sampled (at least partly) under this version")
    since: datetime | None = None
    until: datetime | None = None
    metadata: dict[str, Any] | None = Field(default=None, description="task metadata keys that must equal these values")
    consumed: bool | None = Field(default=None, description="claimed and acknowledged by a trainer, or not yet")
    roles: list[str] | None = Field(default=None, description="chain roles, e.g. main, sub_agent (issue 16)")
    acceptance: Acceptance | None = None
    include_scripted: bool = Field(
        default=False, description="also trajectories holding scripted-policy captures (never trainable)"
    )


def harness_name(dialect: str) -> sa.ColumnElement[str]:
    if dialect == "postgresql":
        return sa.func.jsonb_extract_path_text(Task.harness, "name")
    return sa.func.json_extract(Task.harness, "$.name")


def meta_value(dialect: str, key: str) -> sa.ColumnElement[Any]:
    if dialect == "postgresql":
        return sa.func.jsonb_extract_path_text(Task.meta, key)
    return sa.func.json_extract(Task.meta, f"$.{key}")


def apply(query: Query, f: ExportFilter, dialect: str) -> Query:
    return query.where(*_which(f, dialect), *_quality(f))


def _which(f: ExportFilter, dialect: str) -> list[sa.ColumnElement[bool]]:
    """What the filter selects by: tasks, rollouts, harness, builder, time, role, consumption and metadata."""
    where: list[sa.ColumnElement[bool]] = []
    if f.task_ids is not None:
        where.append(Task.id.in_(f.task_ids))
    if f.task_name is not None:
        where.append(Task.name == f.task_name)
    if f.rollout_id is not None:
        where.append(Trajectory.rollout_id == f.rollout_id)
    if f.harness is not None:
        where.append(harness_name(dialect) == f.harness)
    if f.builder is not None:
        where.append(Trajectory.builder == f.builder)
    elif not f.all_builders:
        # A gateway-only session (no task) exports its default build, the one its close and ``rebuild`` make.
        where.append(Trajectory.builder == sa.func.coalesce(Task.builder, DEFAULT_BUILDER))
    if f.weight_version is not None:
        version = f.weight_version
        where.append(sa.or_(Trajectory.weight_version_min == version, Trajectory.weight_version_max == version))
    if f.since is not None:
        where.append(Trajectory.created_at >= f.since)
    if f.until is not None:
        where.append(Trajectory.created_at < f.until)
    if f.roles:
        where.append(Trajectory.role.in_(f.roles))
    if f.consumed is not None:
        where.append(Trajectory.consumed_by.is_not(None) if f.consumed else Trajectory.consumed_by.is_(None))
    # JSON text on both databases: compare as text (numbers and strings alike).
    where += [sa.cast(meta_value(dialect, k), sa.String) == str(v) for k, v in (f.metadata or {}).items()]
    return where


def _quality(f: ExportFilter) -> list[sa.ColumnElement[bool]]:
    """What the filter keeps by outcome: reward bounds, status, scripted replies and the acceptance rule."""
    where: list[sa.ColumnElement[bool]] = []
    if f.min_reward is not None:
        where.append(Trajectory.reward >= f.min_reward)
    if f.max_reward is not None:
        where.append(Trajectory.reward <= f.max_reward)
    if f.status:
        where.append(Trajectory.status.in_(f.status))
    scripted = f.include_scripted or (f.acceptance is not None and f.acceptance.include_scripted)
    if not scripted:
        where.append(Trajectory.scripted.is_(False))
    if f.acceptance is not None:
        rule = f.acceptance
        where.append(Trajectory.reward >= rule.min_reward)
        if rule.no_errors:
            # The filter's "scripted" mark is no error where scripted conversations were asked for.
            untouched: sa.ColumnElement[bool] = Trajectory.filter_reason.is_(None)
            if scripted:
                untouched = sa.or_(untouched, Trajectory.filter_reason == "scripted")
            where += [Rollout.status == "COMPLETED", untouched]
        if rule.not_truncated:
            where.append(sa.or_(Trajectory.finish_reason.is_(None), Trajectory.finish_reason != "length"))
    return where
