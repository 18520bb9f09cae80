"""Who owns a rollout: claiming it (and taking it over from a dead or silent owner), the heartbeat, and which
rollouts the retry flow should resume."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import rows_matched, session_scope
from db.enums import RolloutStatus
from db.models import Rollout
from db.stage_results import StageResults
from polar.clock import now
from polar.errors import RolloutClaimed
from polar.rollout.state.view import DEADLINE_STAGES, RolloutView, Stage, _row, _view

OwnerProbe = Callable[[str, float], bool]
"""``(owner flow run id, seconds since its last heartbeat) -> whether that flow run is not running any more``.

The flows layer asks the Prefect server (``flows.owners``); without one the stale heartbeat alone decides."""


def claim(
    factory: sessionmaker[Session],
    rollout_id: str,
    owner: str,
    *,
    default_timeout_s: float,
    stale_after_s: float,
    takeover: bool = False,
    owner_gone: OwnerProbe | None = None,
) -> RolloutView:
    """Make ``owner`` the rollout's flow run and arm its deadline; a finished rollout is returned untouched.
    Taking it from another owner closes (revokes) its gateway session first.

    A rollout is free when nobody owns it, ``owner`` already does, or its owner gave it up (a failure was
    recorded). Another owner's rollout is taken over only when both hold: its heartbeat is older than
    ``stale_after_s`` and ``owner_gone`` says its flow run is not running. ``takeover`` (the retry flow's) asks
    for that; it never overrides it, so a second retry run cannot steal a rollout a first one is running, nor
    kill its harness. The claim is one conditional UPDATE on what was read (the owner, its attempt count, the
    heartbeat still stale), so of two claimers at most one wins: never two owners.

    Raises ``RolloutClaimed`` when another flow run holds it, ``NotFound`` for an unknown rollout.
    """
    del takeover  # every takeover is conditional; the flag only says the caller expects to take one over
    with factory() as db:
        row = _row(db, rollout_id, lock=False)
        given_up = row.results.failure is not None
        if RolloutStatus(row.status).is_terminal and not given_up:
            return _view(db, row, default_timeout_s)
        current, seen_attempt, beat = row.flow_run_id, row.attempt, row.heartbeat_at
    at = now()
    cutoff = at - timedelta(seconds=stale_after_s)
    same_claim = (Rollout.attempt == seen_attempt) & (
        Rollout.flow_run_id.is_(None) if current is None else Rollout.flow_run_id == current
    )
    if current is not None and current != owner and not given_up:
        age = (at - beat).total_seconds() if beat is not None else float("inf")
        if age < stale_after_s:
            raise RolloutClaimed(
                f"rollout {rollout_id} is owned by flow run {current} (heartbeat {age:.1f} s ago)", field="rollout_id"
            )
        if owner_gone is not None and not owner_gone(current, age):
            raise RolloutClaimed(
                f"rollout {rollout_id} is owned by flow run {current}, which is still running", field="rollout_id"
            )
        same_claim &= Rollout.heartbeat_at.is_(None) | (Rollout.heartbeat_at < cutoff)
    with session_scope(factory) as db:
        # Taking a rollout from another owner revokes its gateway session in the same statement (the gateway reads
        # ``closed_at`` on every call), so no harness of the old owner makes a call once the new one holds it.
        taken_from_other = Rollout.flow_run_id.is_not(None) & (Rollout.flow_run_id != owner)
        claimed = rows_matched(
            db,
            sa.update(Rollout)
            .where(Rollout.id == rollout_id, same_claim)
            .values(
                flow_run_id=owner,
                attempt=Rollout.attempt + 1,
                heartbeat_at=at,
                closed_at=sa.case((taken_from_other, sa.func.coalesce(Rollout.closed_at, at)), else_=Rollout.closed_at),
            )
            .execution_options(synchronize_session=False),
        )
        if not claimed:
            raise RolloutClaimed(f"rollout {rollout_id} was claimed by another flow run meanwhile", field="rollout_id")
        row = _row(db, rollout_id)
        _clear_failure(row)
        view = _view(db, row, default_timeout_s)
        left = max(0.0, view.timeout_s - view.timings.spent_s(DEADLINE_STAGES))
        row.deadline_at = at + timedelta(seconds=left)
        row.started_at = row.started_at or at
        db.flush()
        return _view(db, row, default_timeout_s)


def heartbeat(factory: sessionmaker[Session], rollout_id: str, owner: str) -> None:
    with session_scope(factory) as db:
        db.execute(
            sa.update(Rollout).where(Rollout.id == rollout_id, Rollout.flow_run_id == owner).values(heartbeat_at=now())
        )


def select_retryable(
    factory: sessionmaker[Session],
    *,
    rollout_ids: Sequence[str] | None = None,
    task_id: str | None = None,
    stale_after_s: float | None = None,
) -> list[str]:
    """Rollouts to retry: those whose pipeline failed (``mark_failed``) and, with ``stale_after_s``, unfinished
    ones whose owner has been silent that long (a killed flow run, or a batch that died before dispatching)."""
    query = sa.select(
        Rollout.id, Rollout.status, Rollout.stage_results, Rollout.heartbeat_at, Rollout.created_at
    ).where(Rollout.task_id.is_not(None))
    if rollout_ids is not None:
        query = query.where(Rollout.id.in_(list(rollout_ids)))
    if task_id is not None:
        query = query.where(Rollout.task_id == task_id)
    stale_before = now() - timedelta(seconds=stale_after_s) if stale_after_s is not None else None
    chosen = []
    with session_scope(factory) as db:
        for rollout_id, status, results, heartbeat_at, created_at in db.execute(
            query.order_by(Rollout.created_at, Rollout.id)
        ):
            if (
                StageResults.of(results).failure is not None
                or stale_before is not None
                and not RolloutStatus(status).is_terminal
                and (heartbeat_at or created_at) <= stale_before
            ):
                chosen.append(rollout_id)
    return chosen


def _clear_failure(row: Rollout) -> None:
    """A claimed rollout that had failed resumes: its failure moves to ``previous_failures``."""
    results = row.results
    failure = results.failure
    if failure is None:
        return
    failed = Stage(failure.stage)
    kept = {k: v for k, v in (row.stage_results or {}).items() if k != "failure"}
    previous = [f.as_json() for f in (*results.previous_failures, failure)]
    row.stage_results = {**kept, "previous_failures": previous}
    row.status = failed.previous.status if failed.previous else RolloutStatus.PENDING
    row.error = None
    row.finished_at = None
