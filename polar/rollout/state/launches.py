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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import CaptureStatus
from db.models import Capture
from polar.clock import now
from polar.rollout.state.view import Stage, _owned

INTERRUPTED_RUNS = "interrupted_runs"


def interrupted_runs(stage_results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The launches of this rollout that were cut short and set aside, oldest first."""
    return list(stage_results.get(INTERRUPTED_RUNS) or [])


def set_aside(
    factory: sessionmaker[Session], rollout_id: str, owner: str, launch: Mapping[str, Any], reason: str
) -> dict[str, Any]:
    """Set the interrupted ``launch`` (the run stage's progress) and its captures aside; returns its record."""
    with session_scope(factory) as db:
        row = _owned(db, rollout_id, owner)  # locked: the capture writer waits
        number = len(row.results.interrupted_runs) + 1
        marked = db.execute(
            sa.update(Capture)
            .where(Capture.rollout_id == rollout_id, Capture.status == CaptureStatus.OK)
            .values(status=CaptureStatus.INTERRUPTED, error=f"made by interrupted harness launch {number}: {reason}")
            .execution_options(synchronize_session=False)
        )
        record = {
            "launch": number,
            "launch_id": launch.get("launch_id"),
            "launched_at": launch.get("launched_at"),
            "host": launch.get("host"),
            "set_aside_at": now().isoformat(),
            "reason": reason,
            "captures_set_aside": int(marked.rowcount or 0),  # type: ignore[attr-defined]
            "seq_end": int(row.next_capture_seq or 0),
        }
        results = dict(row.stage_results or {})
        results[INTERRUPTED_RUNS] = [*interrupted_runs(results), record]
        progress = dict(results.get("progress") or {})
        progress.pop(Stage.RUN.value, None)
        results["progress"] = progress
        row.stage_results = results
        row.heartbeat_at = now()
        return record
