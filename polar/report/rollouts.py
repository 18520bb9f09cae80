"""Rollouts as a text table: status, reward, captures, trajectories, loss tokens, time, and what went wrong.

Used by ``polar demo``, ``polar run`` and ``polar status``; everything comes from the store, so it shows the
same thing whichever process or worker ran the rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import Capture, Rollout, Task, Trajectory
from db.stage_reports import ArtifactSummary
from db.stage_timings import StageTimings


@dataclass(frozen=True)
class RolloutRow:
    task: str
    sample: int
    rollout_id: str
    status: str
    reward: float | None
    captures: int
    trajectories: int
    loss_tokens: int
    seconds: float | None
    note: str  # a table cell: the error's first 60 characters, or what the agent changed
    error: str = ""  # the whole error, for a verdict that must carry its hint


def _note(rollout: Rollout) -> str:
    if rollout.error:
        return rollout.error.splitlines()[0][:60]
    postrun = rollout.results.postrun
    artifacts = postrun.artifacts if postrun is not None else ArtifactSummary()
    if artifacts.changed:
        return f"changed {', '.join(artifacts.changed)}"[:60]
    if artifacts.files:
        return f"files {', '.join(artifacts.files)}"[:60]
    return ""


def rollout_rows(factory: sessionmaker[Session], task_ids: Sequence[str]) -> list[RolloutRow]:
    """The rollouts of ``task_ids``, in the order of the tasks given, then by sample."""
    with factory() as db:
        captures = dict(db.execute(sa.select(Capture.rollout_id, sa.func.count()).group_by(Capture.rollout_id)).all())
        traj = {
            rollout_id: (count, tokens or 0)
            for rollout_id, count, tokens in db.execute(
                sa.select(Trajectory.rollout_id, sa.func.count(), sa.func.sum(Trajectory.n_loss_tokens)).group_by(
                    Trajectory.rollout_id
                )
            )
        }
        query = (
            sa.select(Rollout, Task.name)
            .join(Task, Rollout.task_id == Task.id)
            .where(Rollout.task_id.in_(list(task_ids)))
        )
        order = {task_id: index for index, task_id in enumerate(task_ids)}
        found = sorted(db.execute(query), key=lambda item: (order[item[0].task_id or ""], item[0].sample_index))
        rows = []
        for rollout, name in found:
            seconds = StageTimings.of(rollout.stage_timings).total_s if rollout.stage_timings else None
            count, tokens = traj.get(rollout.id, (0, 0))
            rows.append(
                RolloutRow(
                    task=name or (rollout.task_id or "")[:8],
                    sample=rollout.sample_index,
                    rollout_id=rollout.id,
                    status=rollout.status.value,
                    reward=rollout.reward,
                    captures=captures.get(rollout.id, 0),
                    trajectories=count,
                    loss_tokens=int(tokens),
                    seconds=seconds,
                    note=_note(rollout),
                    error=rollout.error or "",
                )
            )
        return rows


def format_rollouts(rows: Sequence[RolloutRow]) -> str:
    """One line per rollout. Task names are written whole: cut short, different tasks could look alike."""
    width = max([len("task"), *(len(r.task) for r in rows)])
    header = (
        f"{'task':<{width}} {'#':>2} {'rollout':<8} {'status':<10} {'reward':>6} "
        f"{'capt':>4} {'traj':>4} {'loss':>5} {'secs':>5}  note"
    )
    lines = [header]
    for r in rows:
        reward = f"{r.reward:.2f}" if r.reward is not None else "-"
        secs = f"{r.seconds:.1f}" if r.seconds is not None else "-"
        lines.append(
            f"{r.task:<{width}} {r.sample:>2} {r.rollout_id[:8]:<8} {r.status:<10} {reward:>6} {r.captures:>4} "
            f"{r.trajectories:>4} {r.loss_tokens:>5} {secs:>5}  {r.note}"
        )
    return "\n".join(lines)


def _scored(rows: Sequence[RolloutRow]) -> list[float]:
    # ERROR rollouts (infrastructure failures, or a harness that crashed) are not scores: left out of the mean.
    return [r.reward for r in rows if r.reward is not None and r.status != "ERROR"]


def format_groups(rows: Sequence[RolloutRow]) -> str:
    """One line per task (its group of samples, in the order first seen): samples, how many were scored and how
    many ended ERROR, the mean reward and its spread over the scored ones, and how many scored 1. A group whose
    scores do not spread (all 0, all 1) gives GRPO no advantage, which is what this table shows at a glance."""
    groups: dict[str, list[RolloutRow]] = {}
    for r in rows:
        groups.setdefault(r.task, []).append(r)
    width = max([len("task"), *map(len, groups)])
    lines = [f"{'task':<{width}} {'samples':>7} {'scored':>6} {'errors':>6} {'mean':>5} {'spread':>6} {'solved':>6}"]
    for name, group in groups.items():
        scores = _scored(group)
        mean = sum(scores) / len(scores) if scores else None
        spread = (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5 if mean is not None else None
        errors = sum(1 for r in group if r.status == "ERROR")
        solved = sum(1 for x in scores if x >= 1.0)
        lines.append(
            f"{name:<{width}} {len(group):>7} {len(scores):>6} {errors:>6} "
            f"{'-' if mean is None else f'{mean:.2f}':>5} {'-' if spread is None else f'{spread:.2f}':>6} "
            f"{f'{solved}/{len(scores)}':>6}"
        )
    return "\n".join(lines)


def format_totals(rows: Sequence[RolloutRow]) -> str:
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    rewards = _scored(rows)
    # No scored rollout (all ERROR) has no mean: "-", never a 0.00 that reads as a policy's score.
    mean = f"{sum(rewards) / len(rewards):.2f}" if rewards else "-"
    solved = sum(1 for value in rewards if value >= 1.0)
    by_status = ", ".join(f"{name} {count}" for name, count in sorted(statuses.items()))
    return (
        f"{len(rows)} rollouts: {by_status}; mean reward {mean} ({solved} solved); "
        f"{sum(r.captures for r in rows)} captures -> {sum(r.trajectories for r in rows)} trajectories, "
        f"{sum(r.loss_tokens for r in rows)} trainable tokens"
    )
