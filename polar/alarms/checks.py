"""Deciding alarms from the store.

A rollout's facts (``Outcome``) come from its row: its reward and weight version, its stage results (the run
stage's outcome, postrun's git summary, a pipeline ``failure``) and how many model calls it made. ``evaluate``
turns a set of them into alarms; ``batch_alarms`` reads a batch's rollouts, ``recent_alarms`` the live view's
window (rollouts finished in the last ``POLAR_LIVE_WINDOW_S``) plus the gateways past their heartbeat window.

- rewards: a scope (the batch or window, and each weight version in it) with at least ``alarm_min_groups``
  groups (tasks) with a reward, every reward 0 (``all_zero_reward``) or every reward 1 (``all_one_reward``);
- rising shares, once at least ``alarm_min_rollouts`` rollouts count: git rollouts whose patch is empty
  (``empty_patches``) and harness runs that ended without a model call (``no_model_call``). The rollouts are
  ordered by finish; the last ``alarm_rising_recent`` are the recent window, those before the baseline (none
  before: a baseline of 0, a batch that starts broken rose from nothing). It fires when at least
  ``alarm_rising_min_count`` recent rollouts show it, the recent share is over the kind's floor
  (``alarm_empty_patch_share``, ``alarm_no_call_share``) and at least ``alarm_rising_factor`` times the
  baseline's: a steady share (a task set where half the patches are always empty) is the batch's normal, not
  an alarm;
- a fixed rate: finished rollouts that failed in a pipeline stage (a stage that failed for good after its
  retries, the ``failure`` record: infrastructure, not the agent's work; over ``alarm_infra_error_share``);
- ``gateway_silent``: a gateway registered and not stopped whose heartbeat is older than ``gateway_stale_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.enums import RolloutStatus
from db.models import Capture, Gateway, Rollout
from db.stage_reports import ArtifactSummary
from db.stage_results import StageResults
from db.stage_timings import StageTimings
from polar.alarms.kinds import Alarm, AlarmKind
from polar.settings import Settings


@dataclass(frozen=True)
class Outcome:
    """What the alarms read of one rollout."""

    rollout_id: str
    task_id: str | None
    status: RolloutStatus
    reward: float | None
    version: str | None
    calls: int  # captures: model calls the harness made through the gateway
    ran: bool  # the run stage finished (the harness ended on its own)
    git: bool  # postrun collected a git diff
    patch_bytes: int | None  # its size (None when postrun collected none)
    failed_stage: str | None  # a pipeline stage that failed for good
    finished_at: datetime | None = None


def _outcome(row: Any, calls: int) -> Outcome:
    results = StageResults.of(row.stage_results)
    artifacts = results.postrun.artifacts if results.postrun is not None else ArtifactSummary()
    return Outcome(
        rollout_id=row.id,
        task_id=row.task_id,
        status=row.status,
        reward=row.reward,
        version=row.weight_version_max,
        calls=calls,
        ran=StageTimings.of(row.stage_timings).finished("run"),
        git=artifacts.has_diff,
        patch_bytes=artifacts.diff_bytes if artifacts.has_diff else None,
        failed_stage=results.failure.stage if results.failure is not None else None,
        finished_at=row.finished_at,
    )


def outcomes(
    db: Session, *, rollout_ids: Sequence[str] | None = None, finished_since: datetime | None = None
) -> list[Outcome]:
    """The finished rollouts among ``rollout_ids`` (or finished since ``finished_since``)."""
    calls = sa.select(Capture.rollout_id, sa.func.count().label("n")).group_by(Capture.rollout_id).subquery("calls")
    query = (
        sa.select(Rollout, calls.c.n)
        .join(calls, calls.c.rollout_id == Rollout.id, isouter=True)
        .where(Rollout.status.in_([s for s in RolloutStatus if s.is_terminal]))
    )
    if rollout_ids is not None:
        query = query.where(Rollout.id.in_(list(rollout_ids)))
    if finished_since is not None:
        query = query.where(Rollout.finished_at >= finished_since)
    return [_outcome(row, n or 0) for row, n in db.execute(query)]


def _reward_alarms(scope: str, items: list[Outcome], settings: Settings) -> list[Alarm]:
    rewarded = [o for o in items if o.reward is not None]
    groups = sorted({o.task_id or o.rollout_id for o in rewarded})
    if len(groups) < settings.alarm_min_groups:
        return []
    rewards = [o.reward for o in rewarded if o.reward is not None]
    tasks = tuple(t for t in groups if t)
    for kind, value, words in ((AlarmKind.ALL_ZERO_REWARD, 0.0, "0"), (AlarmKind.ALL_ONE_REWARD, 1.0, "1")):
        if all(r == value for r in rewards):
            message = f"{scope}: all {len(rewards)} rewards over {len(groups)} groups are {words}"
            return [Alarm(kind, scope, message, float(len(groups)), float(settings.alarm_min_groups), tasks)]
    return []


def _share_alarm(
    kind: AlarmKind, scope: str, hits: list[Outcome], out_of: list[Outcome], limit: float, what: str, settings: Settings
) -> list[Alarm]:
    if len(out_of) < settings.alarm_min_rollouts or not out_of:
        return []
    share = len(hits) / len(out_of)
    if share <= limit:
        return []
    message = f"{scope}: {len(hits)} of {len(out_of)} {what} ({share:.0%}, over {limit:.0%})"
    tasks = tuple(sorted({o.task_id for o in hits if o.task_id}))
    return [Alarm(kind, scope, message, round(share, 4), limit, tasks)]


def _rising_alarm(
    kind: AlarmKind,
    scope: str,
    hit: Callable[[Outcome], bool],
    out_of: list[Outcome],
    floor: float,
    what: str,
    settings: Settings,
) -> list[Alarm]:
    if len(out_of) < settings.alarm_min_rollouts:
        return []
    ordered = sorted(out_of, key=lambda o: (o.finished_at is None, o.finished_at or datetime.min, o.rollout_id))
    recent, earlier = ordered[-settings.alarm_rising_recent :], ordered[: -settings.alarm_rising_recent]
    hits = [o for o in recent if hit(o)]
    share = len(hits) / len(recent)
    baseline = sum(1 for o in earlier if hit(o)) / len(earlier) if earlier else 0.0
    if len(hits) < settings.alarm_rising_min_count or share <= floor or share < baseline * settings.alarm_rising_factor:
        return []
    message = (
        f"{scope}: {len(hits)} of the last {len(recent)} {what} ({share:.0%}, "
        f"up from {baseline:.0%} over the {len(earlier)} before)"
    )
    tasks = tuple(sorted({o.task_id for o in hits if o.task_id}))
    return [
        Alarm(
            kind, scope, message, round(share, 4), round(max(floor, baseline * settings.alarm_rising_factor), 4), tasks
        )
    ]


def evaluate(items: Sequence[Outcome], settings: Settings, scope: str = "batch") -> list[Alarm]:
    """The alarms a set of finished rollouts raises (each weight version in it judged on its own too)."""
    items = list(items)
    alarms = _reward_alarms(scope, items, settings)
    versions = sorted({o.version for o in items if o.version is not None})
    if len(versions) > 1:
        for version in versions:
            alarms += _reward_alarms(f"version {version}", [o for o in items if o.version == version], settings)
    alarms += _rising_alarm(
        AlarmKind.EMPTY_PATCHES,
        scope,
        lambda o: o.patch_bytes == 0,
        [o for o in items if o.git],
        settings.alarm_empty_patch_share,
        "git rollouts changed nothing",
        settings,
    )
    alarms += _rising_alarm(
        AlarmKind.NO_MODEL_CALL,
        scope,
        lambda o: o.calls == 0,
        [o for o in items if o.ran],
        settings.alarm_no_call_share,
        "harness runs made no model call",
        settings,
    )
    alarms += _share_alarm(
        AlarmKind.INFRA_ERRORS,
        scope,
        [o for o in items if o.failed_stage is not None],
        [o for o in items if o.status is not RolloutStatus.CANCELLED],
        settings.alarm_infra_error_share,
        "rollouts failed in a pipeline stage",
        settings,
    )
    return alarms


def gateway_alarms(db: Session, settings: Settings, at: datetime) -> list[Alarm]:
    """A gateway registered, not stopped, and silent for longer than ``gateway_stale_s``."""
    silent = db.execute(
        sa.select(Gateway.id, Gateway.heartbeat_at)
        .where(Gateway.stopped_at.is_(None), Gateway.heartbeat_at < at - timedelta(seconds=settings.gateway_stale_s))
        .order_by(Gateway.id)
    ).all()
    alarms = []
    for gateway_id, heartbeat_at in silent:
        quiet = (at - heartbeat_at).total_seconds()
        # The message names the silence by its last heartbeat (not its length), so it stays one alarm while it lasts.
        message = f"gateway {gateway_id}: no heartbeat since {heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"
        alarms.append(
            Alarm(AlarmKind.GATEWAY_SILENT, f"gateway {gateway_id}", message, quiet, settings.gateway_stale_s)
        )
    return alarms


def batch_alarms(db: Session, settings: Settings, rollout_ids: Iterable[str]) -> list[Alarm]:
    return evaluate(outcomes(db, rollout_ids=list(rollout_ids)), settings, "batch")


def recent_alarms(db: Session, settings: Settings, at: datetime) -> list[Alarm]:
    """The live view's alarms: the window's rollouts and the silent gateways."""
    since = at - timedelta(seconds=settings.live_window_s)
    window = f"last {settings.live_window_s / 60:g} min"
    return gateway_alarms(db, settings, at) + evaluate(outcomes(db, finished_since=since), settings, window)
