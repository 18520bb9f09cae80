"""Learning curves: per weight version (in the order versions were registered) and per task group, the mean
reward, the solve rate (reward >= 1), trainable tokens per rollout and rollout duration of finished rollouts.

A rollout belongs to the version it last sampled under (``weight_version_max``); versions never registered
(``default``, a server's own name) come first, in the order their first rollout finished. The group is the task's
``metadata.group`` (else its name); every chart also has an ``all`` line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus
from db.models import Rollout, Task, Trajectory, WeightVersion
from polar.export.filters import meta_value

METRICS = {
    "mean_reward": "Mean reward",
    "solve_rate": "Solve rate",
    "trainable_tokens": "Trainable tokens per rollout",
    "duration_s": "Rollout duration (s)",
}
ALL = "all"
STAGES = ("init", "run", "postrun", "evaluate")


@dataclass(frozen=True)
class Curves:
    """``values[metric][group][version]``: the metric over that group's rollouts of that version."""

    versions: list[str]
    groups: list[str]
    values: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    rollouts: dict[str, dict[str, int]] = field(default_factory=dict)  # [group][version]

    def series(self, metric: str) -> dict[str, list[float | None]]:
        """One list per group (``all`` first), one value per version (None where the group has no rollout)."""
        return {g: [self.values[metric].get(g, {}).get(v) for v in self.versions] for g in [ALL, *self.groups]}


FACTS = sa.table(
    "rollout_facts",
    *(sa.column(name) for name in ("rollout_id", "task_id", "status", "reward", "weight_version_max", "created_at")),
    sa.column("finished_at"),
    *(sa.column(f"{stage}_s") for stage in STAGES),
)


def learning_curves(
    db: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> Curves:
    """Aggregated in SQL over the ``rollout_facts`` view (one pass per grouping: by version, and by version and
    group), so the cost is one scan however many rollouts the store holds."""
    dialect = db.get_bind().dialect.name
    f = FACTS
    tokens = (
        sa.select(Trajectory.rollout_id, sa.func.coalesce(sa.func.sum(Trajectory.n_loss_tokens), 0).label("n"))
        .join(Rollout, Rollout.id == Trajectory.rollout_id)
        .join(Task, Task.id == Rollout.task_id, isouter=True)
        .where(Trajectory.builder == sa.func.coalesce(Task.builder, Trajectory.builder))
        .group_by(Trajectory.rollout_id)
        .subquery("tokens")
    )
    seconds = sum((sa.func.coalesce(f.c[f"{stage}_s"], 0.0) for stage in STAGES), sa.literal(0.0))
    solved = sa.case((f.c.reward.is_(None), None), (f.c.reward >= 1, 1.0), else_=0.0)
    label = sa.func.coalesce(sa.cast(meta_value(dialect, "group"), sa.String), Task.name, "(unnamed)")
    measures = (
        sa.func.count().label("n"),
        sa.func.avg(f.c.reward).label("mean_reward"),
        sa.func.avg(solved).label("solve_rate"),
        sa.func.avg(sa.func.coalesce(tokens.c.n, 0)).label("trainable_tokens"),
        sa.func.avg(sa.func.nullif(seconds, 0.0)).label("duration_s"),
        sa.func.min(f.c.finished_at).label("first"),
    )

    def grouped(*keys: Any) -> list[Any]:
        query = (
            sa.select(f.c.weight_version_max.label("version"), *keys, *measures)
            .select_from(f)
            .join(Task, Task.id == f.c.task_id, isouter=True)
            .join(tokens, tokens.c.rollout_id == f.c.rollout_id, isouter=True)
            .where(f.c.status == RolloutStatus.COMPLETED.value, f.c.weight_version_max.is_not(None))
            .group_by(f.c.weight_version_max, *keys)
        )
        if since is not None:
            query = query.where(f.c.created_at >= since)
        if until is not None:
            query = query.where(f.c.created_at < until)
        if task_ids:
            query = query.where(f.c.task_id.in_(list(task_ids)))
        return list(db.execute(query))

    overall = grouped()
    by_group = grouped(label.label("label"))
    registered = {v: i for i, v in enumerate(db.scalars(sa.select(WeightVersion.version).order_by(WeightVersion.id)))}
    first = {row.version: row.first for row in overall}
    versions = sorted(
        first,
        key=lambda v: (1, registered[v], "") if v in registered else (0, 0, str(first[v])),
    )
    values: dict[str, dict[str, dict[str, float]]] = {m: defaultdict(dict) for m in METRICS}
    rollouts: dict[str, dict[str, int]] = defaultdict(dict)
    for group, row in [*((ALL, row) for row in overall), *((row.label, row) for row in by_group)]:
        rollouts[group][row.version] = int(row.n)
        for metric in METRICS:
            value = getattr(row, metric)
            if value is not None:
                values[metric][group][row.version] = float(value)
    groups = sorted({str(row.label) for row in by_group})
    return Curves(versions, groups, {m: dict(v) for m, v in values.items()}, dict(rollouts))


def curve_charts(curves: Curves) -> dict[str, str]:
    """The four charts (inline SVG) by metric name."""
    from polar.live.svg import line_chart

    unit = (0.0, 1.0)
    return {
        metric: line_chart(
            f"{title} by weight version",
            curves.versions,
            curves.series(metric),
            y_range=unit if metric in ("mean_reward", "solve_rate") else None,
            css_class=f"chart {metric}",
        )
        for metric, title in METRICS.items()
    }
