"""Re-derive stored trajectories with a builder, for one rollout, a whole task, or everything since a date.

Captures are read, never written: a rebuild with another builder adds that builder's rows beside the existing
ones, and a rebuild with the same builder replaces its rows. Each rollout is built in its own transaction, so
one rollout whose captures break the tree contract is reported and the rest still rebuild. Rollouts that are
not finished yet are skipped (their postrun stage builds them), and so are rollouts whose rows for the builder
a trainer has already consumed. Rewards come from the rollout row (``rollouts.reward``, broadcast) and the
training filter from its status and stage results, exactly as ``build_and_store`` does by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Rollout
from polar.errors import InvalidRequest, NotFound
from polar.trajectory.records import MergeStats
from polar.trajectory.registry import get_builder
from polar.trajectory.store import TrajectoriesConsumed, build_and_store


@dataclass(frozen=True)
class RolloutRebuild:
    rollout_id: str
    status: str
    stats: MergeStats


@dataclass(frozen=True)
class RebuildReport:
    """What ``rebuild`` did: rollouts rebuilt (with their merge stats), skipped and failed (with the reason)."""

    builder: str
    rebuilt: tuple[RolloutRebuild, ...]
    skipped: tuple[tuple[str, str], ...]
    failed: tuple[tuple[str, str], ...]

    @property
    def captures_in(self) -> int:
        return sum(r.stats.captures_in for r in self.rebuilt)

    @property
    def traces_out(self) -> int:
        return sum(r.stats.traces_out for r in self.rebuilt)

    def summary(self) -> str:
        """One line for a CLI."""
        return (
            f"{self.builder}: rebuilt {len(self.rebuilt)} rollouts ({self.captures_in} captures -> "
            f"{self.traces_out} trajectories), skipped {len(self.skipped)}, failed {len(self.failed)}"
        )


def rebuild(
    session_factory: sessionmaker[Session],
    *,
    builder: str,
    rollout_id: str | None = None,
    task_id: str | None = None,
    since: datetime | None = None,
) -> RebuildReport:
    """Rebuild the trajectories of the rollouts selected by ``rollout_id``, ``task_id`` and/or ``since``
    (rollouts created at or after it; timezone-aware), combined with AND; at least one is required.

    Raises ``InvalidRequest`` for an unknown builder or no selector, ``NotFound`` for an unknown ``rollout_id``.
    """
    get_builder(builder)  # an unknown name fails before anything is read
    if rollout_id is None and task_id is None and since is None:
        raise InvalidRequest("name a rollout, a task or a since date to rebuild", field="rollout_id")
    query = sa.select(Rollout.id, Rollout.status).order_by(Rollout.created_at, Rollout.id)
    if rollout_id is not None:
        query = query.where(Rollout.id == rollout_id)
    if task_id is not None:
        query = query.where(Rollout.task_id == task_id)
    if since is not None:
        query = query.where(Rollout.created_at >= since)
    with session_factory() as session:
        selected = session.execute(query).all()
    if rollout_id is not None and not selected:
        raise NotFound(f"no rollout {rollout_id!r} matches", field="rollout_id")

    rebuilt: list[RolloutRebuild] = []
    skipped: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    for selected_id, status in selected:
        if not RolloutStatus(status).is_terminal:
            skipped.append((selected_id, f"rollout is {status}, not finished"))
            continue
        try:
            with session_scope(session_factory) as session:
                result = build_and_store(session, selected_id, builder=builder)
        except TrajectoriesConsumed as error:
            skipped.append((selected_id, error.message))
        except ValueError as error:
            # CaptureTreeError and invalid records are ValueErrors: bad captures in one rollout must not stop
            # the others, and the report names them.
            failed.append((selected_id, str(error)))
        else:
            rebuilt.append(RolloutRebuild(selected_id, str(status), result.stats))
    return RebuildReport(builder, tuple(rebuilt), tuple(skipped), tuple(failed))
