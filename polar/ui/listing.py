"""Read models of the UI's rollout table and group view: one row per rollout with its counts, filters, paging.

Filters reuse the exports' JSON helpers (``harness_name``, ``meta_value``), so a harness or a task-metadata
group means here what it means to ``polar export``. Counts come from grouped subqueries over the plain count
columns (captures per rollout; trajectories and trainable tokens of the task's own builder), never from arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus
from db.models import Capture, Rollout, Task, Trajectory
from db.stage_timings import StageTimings
from polar.errors import NotFound
from polar.export.filters import harness_name, meta_value

STAGES = ("init", "run", "postrun", "evaluate")

# Any select: the filters add WHERE clauses and keep the columns (and so the row type) as they are.
Query = TypeVar("Query", bound="sa.Select[*tuple[Any, ...]]")


@dataclass(frozen=True)
class RolloutFilter:
    """What the table shows; every field optional. ``task`` is a task name or id, ``version`` a weight version
    the rollout sampled under (its first or last), ``since``/``until`` bound its creation time."""

    task: str | None = None
    harness: str | None = None
    status: tuple[RolloutStatus, ...] = ()
    min_reward: float | None = None
    max_reward: float | None = None
    version: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    group: str | None = None
    task_id: str | None = None
    rollout_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class RolloutItem:
    rollout_id: str
    task_id: str | None
    task: str
    sample: int
    harness: str | None
    group: str | None
    status: str
    reward: float | None
    captures: int
    traces: int
    trainable_tokens: int
    version_min: str | None
    version_max: str | None
    seconds: float | None
    created_at: datetime | None
    error: str | None

    @property
    def running(self) -> bool:
        return not RolloutStatus(self.status).is_terminal


@dataclass(frozen=True)
class RolloutPage:
    items: list[RolloutItem]
    total: int
    offset: int
    limit: int


@dataclass(frozen=True)
class FilterChoices:
    tasks: list[str] = field(default_factory=list)
    harnesses: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)


def _seconds(timings: dict[str, Any] | None) -> float | None:
    if not timings:
        return None
    return StageTimings.of(timings).total_s


def _where(query: Query, f: RolloutFilter, dialect: str) -> Query:
    if f.task is not None:
        query = query.where(sa.or_(Task.name == f.task, Task.id == f.task))
    if f.task_id is not None:
        query = query.where(Rollout.task_id == f.task_id)
    if f.rollout_ids:
        query = query.where(Rollout.id.in_(list(f.rollout_ids)))
    if f.harness is not None:
        query = query.where(harness_name(dialect) == f.harness)
    if f.status:
        query = query.where(Rollout.status.in_(list(f.status)))
    if f.min_reward is not None:
        query = query.where(Rollout.reward >= f.min_reward)
    if f.max_reward is not None:
        query = query.where(Rollout.reward <= f.max_reward)
    if f.version is not None:
        query = query.where(sa.or_(Rollout.weight_version_min == f.version, Rollout.weight_version_max == f.version))
    if f.since is not None:
        query = query.where(Rollout.created_at >= f.since)
    if f.until is not None:
        query = query.where(Rollout.created_at < f.until)
    if f.group is not None:
        query = query.where(sa.cast(meta_value(dialect, "group"), sa.String) == f.group)
    return query


def list_rollouts(db: Session, f: RolloutFilter, *, limit: int, offset: int) -> RolloutPage:
    """The rollouts matching ``f``, newest first, one page of them, and how many match in all."""
    dialect = db.get_bind().dialect.name
    captures = (
        sa.select(Capture.rollout_id, sa.func.count().label("n"))
        .group_by(Capture.rollout_id)
        .subquery("capture_counts")
    )
    traces = (
        sa.select(
            Trajectory.rollout_id,
            sa.func.count().label("n"),
            sa.func.coalesce(sa.func.sum(Trajectory.n_loss_tokens), 0).label("tokens"),
        )
        .join(Rollout, Rollout.id == Trajectory.rollout_id)
        .join(Task, Task.id == Rollout.task_id, isouter=True)
        .where(Trajectory.builder == sa.func.coalesce(Task.builder, Trajectory.builder))
        .group_by(Trajectory.rollout_id)
        .subquery("trace_counts")
    )
    base = sa.select(Rollout.id).join(Task, Task.id == Rollout.task_id, isouter=True)
    total = db.scalar(sa.select(sa.func.count()).select_from(_where(base, f, dialect).subquery())) or 0
    query = (
        sa.select(
            Rollout,
            Task.name,
            harness_name(dialect).label("harness"),
            meta_value(dialect, "group").label("group"),
            captures.c.n,
            traces.c.n,
            traces.c.tokens,
        )
        .join(Task, Task.id == Rollout.task_id, isouter=True)
        .join(captures, captures.c.rollout_id == Rollout.id, isouter=True)
        .join(traces, traces.c.rollout_id == Rollout.id, isouter=True)
    )
    query = _where(query, f, dialect).order_by(Rollout.created_at.desc(), Rollout.task_id, Rollout.sample_index)
    items = [
        RolloutItem(
            rollout_id=row.id,
            task_id=row.task_id,
            task=name or (row.task_id or "")[:8] or "(no task)",
            sample=row.sample_index,
            harness=harness,
            group=None if group is None else str(group),
            status=row.status.value,
            reward=row.reward,
            captures=n_captures or 0,
            traces=n_traces or 0,
            trainable_tokens=int(tokens or 0),
            version_min=row.weight_version_min,
            version_max=row.weight_version_max,
            seconds=_seconds(row.stage_timings),
            created_at=row.created_at,
            error=row.error,
        )
        for row, name, harness, group, n_captures, n_traces, tokens in db.execute(query.limit(limit).offset(offset))
    ]
    return RolloutPage(items, total, offset, limit)


def filter_choices(db: Session) -> FilterChoices:
    """The values the filter menus offer (task names, harnesses, weight versions, groups in the store)."""
    dialect = db.get_bind().dialect.name
    tasks = db.scalars(sa.select(Task.name).where(Task.name.is_not(None)).distinct().order_by(Task.name)).all()
    harnesses = db.scalars(sa.select(harness_name(dialect)).distinct()).all()
    versions = db.scalars(sa.select(Rollout.weight_version_min).distinct()).all()
    groups = db.scalars(sa.select(sa.cast(meta_value(dialect, "group"), sa.String)).distinct()).all()
    return FilterChoices(
        tasks=[t for t in tasks if t],
        harnesses=sorted(h for h in harnesses if h),
        versions=sorted(v for v in versions if v),
        groups=sorted(g for g in groups if g),
    )


@dataclass(frozen=True)
class GroupView:
    """One task's samples (the group GRPO normalises over) and its reward spread."""

    task_id: str
    name: str
    instruction: str
    harness: str | None
    metadata: dict[str, Any]
    items: list[RolloutItem]
    mean: float | None
    std: float | None
    minimum: float | None
    maximum: float | None
    advantages: dict[str, float | None]


def group_view(db: Session, task_id: str) -> GroupView:
    """The group of task ``task_id``; advantages are GRPO's ``(r - mean) / std`` (0 where the spread is 0)."""
    task = db.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}", field="task_id")
    page = list_rollouts(db, RolloutFilter(task_id=task_id), limit=100_000, offset=0)
    items = sorted(page.items, key=lambda item: item.sample)
    rewards = [item.reward for item in items if item.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if mean is not None else None
    advantages: dict[str, float | None] = {}
    for item in items:
        if item.reward is None or mean is None or std is None:
            advantages[item.rollout_id] = None
        else:
            advantages[item.rollout_id] = (item.reward - mean) / std if std > 0 else 0.0
    return GroupView(
        task_id=task.id,
        name=task.name or task.id[:8],
        instruction=task.instruction,
        harness=(task.harness or {}).get("name"),
        metadata=task.meta or {},
        items=items,
        mean=mean,
        std=std,
        minimum=min(rewards) if rewards else None,
        maximum=max(rewards) if rewards else None,
        advantages=advantages,
    )
