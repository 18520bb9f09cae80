"""Revision 0014 on a store with tasks: those already started get the ``legacy`` runner, so no runner takes them
again; a task nothing started stays free for the control API."""

from __future__ import annotations

import sqlalchemy as sa

from db.engine import make_engine
from db.migrate import upgrade


def test_started_tasks_are_marked_legacy_and_unstarted_ones_stay_free(empty_database_url: str) -> None:
    upgrade(empty_database_url, "0013")
    engine = make_engine(empty_database_url)
    try:
        meta = sa.MetaData()
        tasks = sa.Table("tasks", meta, autoload_with=engine)
        rollouts = sa.Table("rollouts", meta, autoload_with=engine)
        spec = {"instruction": "x", "harness": {}, "runtime": {}, "evaluator": {}, "num_samples": 1, "metadata": {}}
        with engine.begin() as db:
            db.execute(sa.insert(tasks), [{"id": name, "status": "PENDING", **spec} for name in ("api", "run", "new")])
            db.execute(sa.update(tasks).where(tasks.c.id == "api").values(dispatched_at=sa.func.now()))
            db.execute(
                sa.insert(rollouts),
                [
                    {"id": "r-api", "task_id": "api", "status": "PENDING", "stage_results": {}, "stage_timings": {}},
                    # an older `polar run` stored its task without dispatching it and claimed the rollout itself
                    {"id": "r-run", "task_id": "run", "status": "RUNNING", "stage_results": {}, "stage_timings": {}},
                    {"id": "r-new", "task_id": "new", "status": "PENDING", "stage_results": {}, "stage_timings": {}},
                ],
            )
        upgrade(empty_database_url)
        with engine.connect() as db:
            rows = {
                r.id: (r.dispatcher, r.dispatched_at is not None) for r in db.execute(sa.text("SELECT * FROM tasks"))
            }
    finally:
        engine.dispose()
    assert rows == {"api": ("legacy", True), "run": ("legacy", True), "new": (None, False)}
