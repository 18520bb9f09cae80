"""Merge statistics per harness for a list of rollouts: captures, merged traces, merge ratio, exact rate.

This is the table to point at sessions recorded from real harness CLIs (``benchmarks/bench_trajectories.py``
prints it). It reads the captures from the store and builds in memory, writing nothing, so it works on any
rollout whether or not its trajectories were stored, and always reflects the current builder. A rollout's
harness is its task's ``harness["name"]``; rollouts without a task are grouped under ``-``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import MergeStat, Rollout, Task
from polar.trajectory.registry import get_builder
from polar.trajectory.store import load_capture_records


@dataclass(frozen=True)
class HarnessSummary:
    harness: str
    rollouts: int
    captures: int  # successful captures (failed ones are never trained on)
    error_captures: int
    traces: int
    exact_merges: int
    inexact_merges: int
    breaks: int

    @property
    def merge_ratio(self) -> float:
        return self.captures / self.traces if self.traces else 0.0

    @property
    def exact_rate(self) -> float | None:
        merges = self.exact_merges + self.inexact_merges
        return self.exact_merges / merges if merges else None


def summarize_by_harness(
    session: Session, rollout_ids: Sequence[str], *, builder: str = "prefix_merge"
) -> list[HarnessSummary]:
    """One row per harness over ``rollout_ids`` (unknown ids are ignored), sorted by harness name."""
    build = get_builder(builder)
    rows = session.execute(
        sa.select(Rollout.id, Task.harness)
        .outerjoin(Task, Rollout.task_id == Task.id)
        .where(Rollout.id.in_(rollout_ids))
    ).all()
    totals: dict[str, list[int]] = {}
    for rollout_id, harness in rows:
        name = str((harness or {}).get("name", "-"))
        stats = build(load_capture_records(session, rollout_id)).stats
        row = totals.setdefault(name, [0] * 7)
        for i, value in enumerate(
            (
                1,
                stats.ok_captures,
                stats.error_captures,
                stats.traces_out,
                stats.exact_merges,
                stats.inexact_merges,
                stats.breaks,
            )
        ):
            row[i] += value
    return [HarnessSummary(name, *values) for name, values in sorted(totals.items())]


def format_summary(rows: Sequence[HarnessSummary]) -> str:
    """The summary as a fixed-width text table."""
    header = ("rollouts", "captures", "failed", "traces", "ratio", "exact", "breaks")
    lines = [f"{'harness':<16} " + " ".join(f"{name:>8}" for name in header)]
    for row in rows:
        exact = f"{row.exact_rate:.1%}" if row.exact_rate is not None else "-"
        lines.append(
            f"{row.harness:<16} {row.rollouts:>8} {row.captures:>8} {row.error_captures:>8} {row.traces:>8} "
            f"{row.merge_ratio:>8.2f} {exact:>8} {row.breaks:>8}"
        )
    return "\n".join(lines)


def stored_token_lines(
    session: Session, *, rollout_id: str | None = None, task_id: str | None = None, builder: str | None = None
) -> list[str]:
    """``polar trajectories stats``: one line per stored build (``merge_stats``) of the chosen rollouts: sampled
    tokens, trainable after the training filter, every untrained token by reason, and the root causes."""
    query = sa.select(MergeStat).join(Rollout, Rollout.id == MergeStat.rollout_id).order_by(MergeStat.id)
    if rollout_id is not None:
        query = query.where(MergeStat.rollout_id == rollout_id)
    if task_id is not None:
        query = query.where(Rollout.task_id == task_id)
    if builder is not None:
        query = query.where(MergeStat.builder == builder)
    lines = []
    for row in session.scalars(query):
        trainable = row.trainable_tokens if row.trainable_tokens is not None else row.loss_tokens
        untrained = ", ".join(f"{k} {v}" for k, v in sorted((row.untrained_tokens or {}).items())) or "none"
        causes = ", ".join(f"{k} {v}" for k, v in sorted((row.root_causes or {}).items())) or "none"
        lines.append(
            f"{row.rollout_id} {row.builder}: sampled {row.sampled_tokens}, trainable {trainable}, "
            f"untrained: {untrained}; root causes: {causes}"
        )
    return lines
