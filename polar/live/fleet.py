"""The live view's read model of the store: gateways by heartbeat, stage occupancy against the limits, the READY
buffer, throughput and failures over the window, and the weight version being collected against the current one.

Stage occupancy counts the rollouts inside a stage: a rollout's status becomes the stage's once it holds the
stage's slot and its ``stage`` (the last one finished) becomes the stage as it gives the slot back, so a status
of ``INIT`` with ``stage`` not yet ``init`` is a held init slot (and likewise for run, postrun, evaluate): the
counts never exceed the limits. The READY buffer is the rollouts between taking a ready slot and getting a run
slot that the store can see: those in ``INIT`` (initialising, or initialised and waiting for a run slot); one
that holds a ready slot while it waits for an init slot is still ``PENDING`` there, so the count is a lower bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus
from db.models import Capture, Gateway, Rollout, WeightVersion
from db.stage_results import StageResults
from polar.rollout.limits import stage_limits
from polar.settings import Settings


class GatewayState(StrEnum):
    """UP: a fresh heartbeat and it answers; DRAINING: it announced its shutdown (``gateways.draining_at``) and
    finishes the calls it holds, or a fresh heartbeat but it no longer answers (unreachable from here); DOWN:
    silent past ``POLAR_GATEWAY_STALE_S``; STOPPED: it deregistered (shown for one stale window after)."""

    UP = "UP"
    DRAINING = "DRAINING"
    DOWN = "DOWN"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class GatewayEntry:
    id: str
    url: str
    heartbeat_at: datetime
    silent_s: float
    stopped: bool
    started_at: datetime
    draining: bool = False  # it announced its shutdown


@dataclass(frozen=True)
class StageLoad:
    stage: str
    occupied: int
    limit: int | None  # evaluate has none


@dataclass(frozen=True)
class Throughput:
    window_s: float
    finished: int
    failed: int
    per_minute: float
    failed_per_minute: float
    causes: list[tuple[str, int]]  # failure cause, rollouts (most first)


@dataclass(frozen=True)
class Versions:
    current: str | None
    registered: int
    collecting: int  # rollouts under way that sampled already
    behind_max: int | None  # versions between the oldest being collected and the current one
    behind_mean: float | None


@dataclass(frozen=True)
class FleetState:
    at: datetime
    gateways: list[GatewayEntry]
    stages: list[StageLoad]
    ready: StageLoad
    pending: int
    throughput: Throughput
    versions: Versions


STAGE_STATUS = {
    "init": RolloutStatus.INIT,
    "run": RolloutStatus.RUNNING,
    "postrun": RolloutStatus.POSTRUN,
    "evaluate": RolloutStatus.EVALUATING,
}


def gateway_entries(db: Session, at: datetime, stale_s: float) -> list[GatewayEntry]:
    """Registered gateways not stopped, and those stopped within the last stale window."""
    rows = db.scalars(
        sa.select(Gateway)
        .where(sa.or_(Gateway.stopped_at.is_(None), Gateway.stopped_at >= at - timedelta(seconds=stale_s)))
        .order_by(Gateway.started_at, Gateway.id)
    ).all()
    return [
        GatewayEntry(
            id=row.id,
            url=row.url,
            heartbeat_at=row.heartbeat_at,
            silent_s=max(0.0, (at - row.heartbeat_at).total_seconds()),
            stopped=row.stopped_at is not None,
            started_at=row.started_at,
            draining=row.draining_at is not None,
        )
        for row in rows
    ]


def state_of(entry: GatewayEntry, stale_s: float, answered: bool) -> GatewayState:
    if entry.stopped:
        return GatewayState.STOPPED
    if entry.silent_s > stale_s:
        return GatewayState.DOWN
    return GatewayState.UP if answered and not entry.draining else GatewayState.DRAINING


def failure_cause(status: RolloutStatus, failed_stage: str | None) -> str:
    if failed_stage:
        return f"{failed_stage} failed"
    return {RolloutStatus.TIMEOUT: "timeout", RolloutStatus.CANCELLED: "cancelled"}.get(status, "harness error")


def _throughput(db: Session, at: datetime, window_s: float) -> Throughput:
    since = at - timedelta(seconds=window_s)
    rows = db.execute(
        sa.select(Rollout.status, Rollout.stage_results).where(
            Rollout.finished_at >= since, Rollout.status.in_([s for s in RolloutStatus if s.is_terminal])
        )
    ).all()
    causes: Counter[str] = Counter()
    for status, results in rows:
        if status is not RolloutStatus.COMPLETED:
            failure = StageResults.of(results).failure
            causes[failure_cause(status, failure.stage if failure is not None else None)] += 1
    failed = sum(causes.values())
    minutes = window_s / 60
    return Throughput(window_s, len(rows), failed, len(rows) / minutes, failed / minutes, causes.most_common())


def _versions(db: Session) -> Versions:
    """The current version and how far behind it the rollouts under way sample: each one's oldest version among
    its captures so far (versions never registered count as older than every registered one)."""
    registered = list(db.scalars(sa.select(WeightVersion.version).order_by(WeightVersion.id)))
    ordinal = {version: i for i, version in enumerate(registered)}
    sampled = db.execute(
        sa.select(Capture.rollout_id, Capture.weight_version)
        .join(Rollout, Rollout.id == Capture.rollout_id)
        .where(Rollout.status.in_([s for s in RolloutStatus if not s.is_terminal]), Capture.weight_version.is_not(None))
        .distinct()
    ).all()
    oldest: dict[str, int] = {}
    for rollout_id, version in sampled:
        position = ordinal.get(version or "", -1)
        oldest[rollout_id] = min(position, oldest.get(rollout_id, position))
    current = registered[-1] if registered else None
    behind = [len(registered) - 1 - position for position in oldest.values()] if current is not None else []
    if current is None:
        behind = [0 for _ in oldest]
    return Versions(
        current=current,
        registered=len(registered),
        collecting=len(oldest),
        behind_max=max(behind) if behind else None,
        behind_mean=sum(behind) / len(behind) if behind else None,
    )


def fleet_state(db: Session, settings: Settings, at: datetime) -> FleetState:
    rows = db.execute(
        sa.select(Rollout.status, Rollout.stage, sa.func.count())
        .where(Rollout.status.in_([s for s in RolloutStatus if not s.is_terminal]))
        .group_by(Rollout.status, Rollout.stage)
    ).all()
    inside: Counter[str] = Counter()  # rollouts inside a stage (its status, the stage not finished yet)
    by_status: Counter[RolloutStatus] = Counter()
    for status, done, n in rows:
        by_status[status] += n
        for stage, stage_status in STAGE_STATUS.items():
            if status is stage_status and done != stage:
                inside[stage] += n
    limits = stage_limits(settings)
    stages = [StageLoad(stage, inside[stage], limits.get(stage)) for stage in STAGE_STATUS]
    return FleetState(
        at=at,
        gateways=gateway_entries(db, at, settings.gateway_stale_s),
        stages=stages,
        ready=StageLoad("ready", by_status[RolloutStatus.INIT], limits["ready"]),
        pending=by_status[RolloutStatus.PENDING],
        throughput=_throughput(db, at, settings.live_window_s),
        versions=_versions(db),
    )
