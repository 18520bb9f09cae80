"""Harness launches that were cut short: setting one aside so the run stage can launch the harness again.

A run stage that finds a launch in its progress but no end (its flow run died with the harness still running)
launches again, at most ``POLAR_RUN_RETRIES`` times per rollout. Before it does, ``set_aside`` does in one
transaction, with the rollout's row locked (the capture writer takes the same lock to number a capture, and
commits only while the session is open under the key it was authenticated with; the session is closed before
this runs, so no call of the old launch can commit afterwards):

- every OK capture of the rollout becomes ``INTERRUPTED`` with ``error`` naming the launch: kept, never trained,
  never merged into the new launch's trajectories, and skipped by the gateway's history, so no call of the new
  launch extends one of them;
- the launch is appended to ``stage_results["interrupted_runs"]`` (its id, when it started, where, the
  captures set aside and ``seq_end``: every capture with a lower seq belongs to an earlier launch), a key no
  reopened stage clears, so the count of relaunches survives re-initialising the runtime;
- the run stage's progress is cleared, ready for the new launch.

``calls_since_set_aside`` counts the current launch's calls (the run stage's check that an agent called the model).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import CaptureStatus
from db.models import Capture
from db.stage_results import InterruptedRun, RunProgress
from polar.clock import now
from polar.rollout.state.view import Stage, _owned


def set_aside(
    factory: sessionmaker[Session], rollout_id: str, owner: str, launch: RunProgress, reason: str
) -> InterruptedRun:
    """Set the interrupted ``launch`` (the run stage's progress) and its captures aside; returns its record."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)  # locked: the capture writer waits
        results = row.results
        number = len(results.interrupted_runs) + 1
        marked = db.execute(
            sa.update(Capture)
            .where(Capture.rollout_id == rollout_id, Capture.status == CaptureStatus.OK)
            .values(status=CaptureStatus.INTERRUPTED, error=f"made by interrupted harness launch {number}: {reason}")
            .execution_options(synchronize_session=False)
        )
        record = InterruptedRun(
            launch=number,
            launch_id=launch.launch_id,
            launched_at=launch.launched_at,
            host=launch.host,
            set_aside_at=now().isoformat(),
            reason=reason,
            captures_set_aside=int(marked.rowcount or 0),  # type: ignore[attr-defined]
            seq_end=int(row.next_capture_seq or 0),
        )
        row.stage_results = {
            **(row.stage_results or {}),
            "interrupted_runs": [r.as_json() for r in (*results.interrupted_runs, record)],
            "progress": results.progress.without({Stage.RUN.value}),
        }
        row.heartbeat_at = now()
        return record


def calls_since_set_aside(factory: sessionmaker[Session], rollout_id: str) -> int:
    """The rollout's captures, failed calls included, less those of launches set aside: the current launch's."""
    with session_scope(factory) as db:
        query = sa.select(sa.func.count()).where(
            Capture.rollout_id == rollout_id, Capture.status != CaptureStatus.INTERRUPTED
        )
        return int(db.scalar(query) or 0)
