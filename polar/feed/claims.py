"""Exactly-once batches of complete groups for trainers.

A *group* is one task whose samples have all finished (status COMPLETED or FAILED); its trajectories are those
its task's builder made for its non-ERROR rollouts. An ERROR rollout failed for infrastructure reasons (an image
that did not build, a crashed verifier): it says nothing about the policy, so it is left out of the group, and a
group is offered only when at least ``min_samples`` of its rollouts are not ERROR (``POLAR_CLAIM_MIN_SAMPLES``).
``claim`` hands a trainer up to ``max_groups`` groups that no claim holds or consumed,
under a lease; ``ack`` consumes them, ``release`` hands them back, and a lease that runs out (a crashed trainer)
is expired by the next ``claim`` so the groups go to someone else.

Exactly once on both databases: a group is taken by ``UPDATE tasks SET claim_id = :new WHERE id = ... AND
claim_id IS NULL``, so of two claimers racing for a group only one update matches, and a claim returns only the
groups its own update took. On Postgres the candidates are also read ``FOR UPDATE SKIP LOCKED``, so concurrent
claimers pass over each other's rows instead of queueing behind them; SQLite serialises writers itself.

Staleness: with ``max_staleness = k`` a group is offered only if every sample's oldest weight version is at most
``k`` versions behind the current one (``polar.feed.versions``); staler groups stay unclaimed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import rows_matched, session_scope
from db.enums import ClaimStatus, RolloutStatus, TaskStatus
from db.models import Claim, Rollout, Task, Trajectory
from polar.clock import now
from polar.errors import Conflict, InvalidRequest, NotFound
from polar.feed import versions

COMPLETE = (TaskStatus.COMPLETED, TaskStatus.FAILED)


@dataclass(frozen=True)
class FeedTrajectory:
    """One training sequence as a trainer consumes it (aligned response ids, loss mask and logprobs), with the
    weight version and the sampling regime of each span of sampled tokens (``polar.trajectory.sampling``): a
    trainer weighing the stored logprobs needs both."""

    id: int
    rollout_id: str
    sample_index: int
    chain_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]
    reward: float | None
    status: str
    filter_reason: str | None
    weight_version_min: str | None
    weight_version_max: str | None
    kept: bool  # the chain the harness kept (``polar.trajectory.liveness``)
    version_spans: list[dict[str, Any]]
    sampling_spans: list[dict[str, Any]] | None  # the sampling regime per span (null: built before revision 0020)


@dataclass(frozen=True)
class Group:
    task_id: str
    name: str | None
    metadata: dict[str, Any]
    builder: str
    staleness: int
    trajectories: list[FeedTrajectory]


@dataclass(frozen=True)
class ClaimedBatch:
    claim_id: str | None  # None when nothing was claimable
    trainer: str
    lease_expires_at: datetime | None
    current_version: str | None
    groups: list[Group]

    @property
    def n_trajectories(self) -> int:
        return sum(len(group.trajectories) for group in self.groups)


def claim(
    factory: sessionmaker[Session],
    trainer: str,
    *,
    max_groups: int = 1,
    lease_s: float = 300.0,
    max_staleness: int | None = None,
    min_samples: int = 1,
) -> ClaimedBatch:
    """Take up to ``max_groups`` unclaimed complete groups for ``trainer`` (oldest finished first)."""
    if not trainer or len(trainer) > 128:
        raise InvalidRequest("trainer must be 1 to 128 characters", field="trainer")
    if max_groups < 1:
        raise InvalidRequest("max_groups must be at least 1", field="max_groups")
    if lease_s <= 0:
        raise InvalidRequest("lease_s must be positive", field="lease_s")
    if max_staleness is not None and max_staleness < 0:
        raise InvalidRequest("max_staleness must be 0 or more", field="max_staleness")
    if min_samples < 0:
        raise InvalidRequest("min_samples must be 0 or more", field="min_samples")
    at = now()
    with session_scope(factory) as db:
        expire_leases(db, at)
        known = versions.ordinals(db)
        current_ordinal = len(known)
        current = next(reversed(known), None) if known else None
        candidates = (
            sa.select(Task.id)
            .where(Task.status.in_(COMPLETE), Task.claim_id.is_(None))
            .order_by(Task.priority.desc(), Task.finished_at, Task.id)
            .limit(max_groups)
            .with_for_update(skip_locked=True)
        )
        if min_samples > 0:
            valid = (
                sa.select(sa.func.count())
                .where(Rollout.task_id == Task.id, Rollout.status != RolloutStatus.ERROR)
                .scalar_subquery()
            )
            candidates = candidates.where(valid >= min_samples)
        if max_staleness is not None and current_ordinal - max_staleness > 0:
            fresh = [name for name, ordinal in known.items() if ordinal >= current_ordinal - max_staleness]
            stale_sample = sa.exists().where(
                Rollout.task_id == Task.id,
                Rollout.weight_version_min.is_not(None),
                Rollout.weight_version_min.not_in(fresh),
            )
            candidates = candidates.where(~stale_sample)
        task_ids = list(db.scalars(candidates))
        if not task_ids:
            return ClaimedBatch(None, trainer, None, current, [])
        row = Claim(
            trainer=trainer,
            status=ClaimStatus.ACTIVE,
            n_groups=0,
            n_trajectories=0,
            lease_expires_at=at + timedelta(seconds=lease_s),
        )
        db.add(row)
        db.flush()
        db.execute(
            sa.update(Task)
            .where(Task.id.in_(task_ids), Task.claim_id.is_(None))
            .values(claim_id=row.id)
            .execution_options(synchronize_session=False)
        )
        groups = _groups(db, row.id, known)
        row.n_groups, row.n_trajectories = len(groups), sum(len(g.trajectories) for g in groups)
        return ClaimedBatch(row.id, trainer, row.lease_expires_at, current, groups)


def ack(factory: sessionmaker[Session], claim_id: str, trainer: str) -> dict[str, Any]:
    """Consume a claim's groups: their trajectories are marked ``consumed_by`` the trainer, for good."""
    at = now()
    with session_scope(factory) as db:
        row = _held(db, claim_id, trainer, at)
        row.status, row.finished_at = ClaimStatus.ACKED, at
        rollouts = sa.select(Rollout.id).join(Task, Task.id == Rollout.task_id).where(Task.claim_id == claim_id)
        consumed = rows_matched(
            db,
            sa.update(Trajectory)
            .where(Trajectory.rollout_id.in_(rollouts), Trajectory.builder == _builder_of_rollout())
            .values(consumed_by=trainer, consumed_at=at)
            .execution_options(synchronize_session=False),
        )
        return {"claim_id": claim_id, "status": row.status.value, "groups": row.n_groups, "trajectories": consumed}


def release(factory: sessionmaker[Session], claim_id: str, trainer: str) -> dict[str, Any]:
    """Hand a claim's groups back unconsumed; the next claim may take them."""
    at = now()
    with session_scope(factory) as db:
        row = _held(db, claim_id, trainer, at)
        row.status, row.finished_at = ClaimStatus.RELEASED, at
        _free_groups(db, [claim_id])
        return {"claim_id": claim_id, "status": row.status.value, "groups": row.n_groups}


def renew(factory: sessionmaker[Session], claim_id: str, trainer: str, lease_s: float) -> datetime:
    """Extend a held claim's lease by ``lease_s`` from now (a trainer still working on it)."""
    if lease_s <= 0:
        raise InvalidRequest("lease_s must be positive", field="lease_s")
    at = now()
    with session_scope(factory) as db:
        row = _held(db, claim_id, trainer, at)
        row.lease_expires_at = at + timedelta(seconds=lease_s)
        return row.lease_expires_at


def expire_leases(db: Session, at: datetime) -> list[str]:
    """Expire every ACTIVE claim whose lease ran out and free its groups; returns the expired ids."""
    expired = list(
        db.scalars(
            sa.update(Claim)
            .where(Claim.status == ClaimStatus.ACTIVE, Claim.lease_expires_at < at)
            .values(status=ClaimStatus.EXPIRED, finished_at=at)
            .returning(Claim.id)
            .execution_options(synchronize_session=False)
        )
    )
    if expired:
        _free_groups(db, expired)
    return expired


def _held(db: Session, claim_id: str, trainer: str, at: datetime) -> Claim:
    """The claim, locked, if ``trainer`` holds it and its lease is live; otherwise a clear error."""
    row = db.get(Claim, claim_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no claim {claim_id}", field="claim_id")
    if row.trainer != trainer:
        raise Conflict(f"claim {claim_id} belongs to trainer {row.trainer!r}, not {trainer!r}", field="trainer")
    if row.status is ClaimStatus.ACTIVE and row.lease_expires_at < at:
        row.status, row.finished_at = ClaimStatus.EXPIRED, at
        _free_groups(db, [claim_id])
        db.commit()
        raise Conflict(
            f"claim {claim_id} expired at {row.lease_expires_at.isoformat()}; its groups were freed", field="claim_id"
        )
    if row.status is not ClaimStatus.ACTIVE:
        raise Conflict(f"claim {claim_id} is {row.status.value}, not ACTIVE", field="claim_id")
    return row


def _free_groups(db: Session, claim_ids: list[str]) -> None:
    db.execute(
        sa.update(Task)
        .where(Task.claim_id.in_(claim_ids))
        .values(claim_id=None)
        .execution_options(synchronize_session=False)
    )


def _builder_of_rollout() -> Any:
    """The builder of the task a trajectory's rollout belongs to (a correlated scalar subquery)."""
    return (
        sa.select(Task.builder)
        .join(Rollout, Rollout.task_id == Task.id)
        .where(Rollout.id == Trajectory.rollout_id)
        .scalar_subquery()
    )


def _groups(db: Session, claim_id: str, known: dict[str, int]) -> list[Group]:
    tasks = db.scalars(
        sa.select(Task).where(Task.claim_id == claim_id).order_by(Task.priority.desc(), Task.finished_at, Task.id)
    ).all()
    rows = db.execute(
        sa.select(Trajectory, Task.id, Rollout.sample_index)
        .join(Rollout, Rollout.id == Trajectory.rollout_id)
        .join(Task, Task.id == Rollout.task_id)
        .where(Task.claim_id == claim_id, Trajectory.builder == Task.builder, Rollout.status != RolloutStatus.ERROR)
        .order_by(Rollout.sample_index, Trajectory.chain_index)
    ).all()
    by_task: dict[str, list[FeedTrajectory]] = defaultdict(list)
    oldest: dict[str, int] = {}
    for trajectory, task_id, sample_index in rows:
        by_task[task_id].append(_feed(trajectory, sample_index))
        if trajectory.weight_version_min is not None:
            ordinal = known.get(trajectory.weight_version_min, 0)
            oldest[task_id] = min(oldest.get(task_id, ordinal), ordinal)
    return [
        Group(
            task.id,
            task.name,
            dict(task.meta or {}),
            task.builder,
            len(known) - oldest.get(task.id, len(known)),
            by_task[task.id],
        )
        for task in tasks
    ]


def _feed(row: Trajectory, sample_index: int) -> FeedTrajectory:
    return FeedTrajectory(
        id=row.id,
        rollout_id=row.rollout_id,
        sample_index=sample_index,
        chain_index=row.chain_index,
        prompt_ids=list(row.prompt_ids),
        response_ids=list(row.response_ids),
        loss_mask=list(row.loss_mask),
        response_logprobs=list(row.response_logprobs),
        reward=row.reward,
        status=row.status,
        filter_reason=row.filter_reason,
        weight_version_min=row.weight_version_min,
        weight_version_max=row.weight_version_max,
        kept=row.kept,
        version_spans=list(row.version_spans or ()),
        sampling_spans=list(row.sampling_spans) if row.sampling_spans is not None else None,
    )
