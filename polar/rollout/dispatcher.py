"""Submission ownership: the one runner that starts a task's rollouts.

Every runner that starts rollouts (the batch flow behind ``polar run`` and ``polar demo``, the batch deployment,
SFT generation, each control API replica) has a dispatcher id of its own (``new_dispatcher``). A task belongs
to at most one of them, recorded in ``tasks.dispatcher`` with ``dispatched_at``:

- a runner that stores its own tasks owns them from the insert (``submit_tasks(..., dispatcher=...)``), so no
  other runner ever sees them unowned;
- tasks stored without one (``POST /v1/tasks``) are taken with ``take``: one conditional UPDATE that matches
  only a task with no dispatcher, the compare-and-swap rollouts are claimed with, so of two runners at most one
  wins.

A runner starts only the rollouts of tasks it holds (``split_owned``); the rollout claim
(``polar.rollout.state.claim``) then keeps each rollout to one flow run. The retry flow is the one exception: it
resumes failed or stale rollouts whoever dispatched them, and the rollout claim's takeover rules decide.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import rows_matched, session_scope
from db.models import Rollout, Task
from polar.clock import now

MAX_LENGTH = 128


def new_dispatcher(kind: str, run_id: str | None = None) -> str:
    """A runner's id, ``kind:host:pid:run`` (``run_id``: its flow run; default a random one), at most 128 chars."""
    run = run_id or uuid.uuid4().hex[:12]
    return f"{kind}:{socket.gethostname()[:48]}:{os.getpid()}:{run}"[:MAX_LENGTH]


def take(db: Session, task_id: str, dispatcher: str) -> bool:
    """Make ``dispatcher`` the task's runner if it has none, in ``db``'s transaction; True when it won."""
    won = rows_matched(
        db,
        sa.update(Task)
        .where(Task.id == task_id, Task.dispatcher.is_(None))
        .values(dispatcher=dispatcher, dispatched_at=now())
        .execution_options(synchronize_session=False),
    )
    return won == 1


def split_owned(
    factory: sessionmaker[Session], rollout_ids: Sequence[str], dispatcher: str
) -> tuple[list[str], dict[str, str]]:
    """``rollout_ids`` whose task ``dispatcher`` holds (in the given order), and the others -> why not."""
    if not rollout_ids:
        return [], {}
    with session_scope(factory) as db:
        rows = db.execute(
            sa.select(Rollout.id, Rollout.task_id, Task.dispatcher)
            .outerjoin(Task, Task.id == Rollout.task_id)
            .where(Rollout.id.in_(list(rollout_ids)))
        ).all()
    holder = {row.id: (row.task_id, row.dispatcher) for row in rows}
    owned, refused = [], {}
    for rollout_id in rollout_ids:
        task_id, held_by = holder.get(rollout_id, (None, None))
        if rollout_id not in holder:
            refused[rollout_id] = f"no rollout {rollout_id}"
        elif held_by == dispatcher:
            owned.append(rollout_id)
        elif held_by is None:
            refused[rollout_id] = f"task {task_id} was not taken by this runner ({dispatcher})"
        else:
            refused[rollout_id] = f"task {task_id} is dispatched by another runner ({held_by})"
    return owned, refused
