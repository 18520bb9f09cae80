"""Learning curves: per weight version (in the order versions were registered) and per task group, the mean
reward, the solve rate (reward >= 1), trainable tokens per rollout and rollout duration of finished rollouts.

A rollout belongs to the version it last sampled under (``weight_version_max``); versions never registered
(``default``, a server's own name) come first, in the order they were first sampled. The group is the task's
``metadata.group`` (else its name); every chart also has an ``all`` line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

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


def _duration(timings: dict | None) -> float | None:
    if not timings:
        return None
    seconds = [float((timings.get(s) or {}).get("duration_s") or 0.0) for s in STAGES]
    return sum(seconds) if any(seconds) else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def learning_curves(
    db: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    task_ids: Sequence[str] | None = None,
) -> Curves:
    dialect = db.get_bind().dialect.name
    tokens = (
        sa.select(Trajectory.rollout_id, sa.func.coalesce(sa.func.sum(Trajectory.n_loss_tokens), 0).label("n"))
        .join(Rollout, Rollout.id == Trajectory.rollout_id)
        .join(Task, Task.id == Rollout.task_id, isouter=True)
        .where(Trajectory.builder == sa.func.coalesce(Task.builder, Trajectory.builder))
        .group_by(Trajectory.rollout_id)
        .subquery("tokens")
    )
    query = (
        sa.select(
            Rollout.weight_version_max,
            Rollout.reward,
            Rollout.stage_timings,
            Rollout.finished_at,
            Task.name,
            sa.cast(meta_value(dialect, "group"), sa.String).label("group"),
            tokens.c.n,
        )
        .join(Task, Task.id == Rollout.task_id, isouter=True)
        .join(tokens, tokens.c.rollout_id == Rollout.id, isouter=True)
        .where(Rollout.status == RolloutStatus.COMPLETED, Rollout.weight_version_max.is_not(None))
        .order_by(Rollout.finished_at)
    )
    if since is not None:
        query = query.where(Rollout.created_at >= since)
    if until is not None:
        query = query.where(Rollout.created_at < until)
    if task_ids:
        query = query.where(Rollout.task_id.in_(list(task_ids)))
    registered = {v: i for i, v in enumerate(db.scalars(sa.select(WeightVersion.version).order_by(WeightVersion.id)))}
    first_seen: dict[str, int] = {}
    samples: dict[str, dict[tuple[str, str], list[float]]] = {m: defaultdict(list) for m in METRICS}
    count: dict[tuple[str, str], int] = defaultdict(int)
    for version, reward, timings, _, name, group, n_tokens in db.execute(query):
        first_seen.setdefault(version, len(first_seen))
        label = group or name or "(unnamed)"
        duration = _duration(timings)
        for g in (ALL, label):
            key = (g, version)
            count[key] += 1
            if reward is not None:
                samples["mean_reward"][key].append(float(reward))
                samples["solve_rate"][key].append(1.0 if reward >= 1.0 else 0.0)
            samples["trainable_tokens"][key].append(float(n_tokens or 0))
            if duration is not None:
                samples["duration_s"][key].append(duration)
    unregistered = len(registered)
    versions = sorted(
        first_seen, key=lambda v: (0, first_seen[v]) if v not in registered else (1, registered[v] - unregistered)
    )
    groups = sorted({g for g, _ in count if g != ALL})
    values: dict[str, dict[str, dict[str, float]]] = {}
    for metric, by_key in samples.items():
        table: dict[str, dict[str, float]] = defaultdict(dict)
        for (g, v), xs in by_key.items():
            mean = _mean(xs)
            if mean is not None:
                table[g][v] = mean
        values[metric] = dict(table)
    rollouts: dict[str, dict[str, int]] = defaultdict(dict)
    for (g, v), n in count.items():
        rollouts[g][v] = n
    return Curves(versions, groups, values, dict(rollouts))


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
