"""A runner starts only the rollouts of tasks it holds, and the batch summary names every rollout it did not run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flows.batch import summarize
from flows.dispatch import NOT_DISPATCHED, Dispatch, _outcome, dispatch_rollouts, run_elsewhere
from polar.errors import RolloutClaimed
from polar.rollout import submit_tasks
from polar.rollout.context import store_factory
from tests.rollout.helpers import answer_task, rollout_row, test_settings


async def test_a_runner_leaves_another_runners_tasks_alone_and_reports_them_not_run(tmp_path: Path, cache_dir: Path):
    settings = test_settings(tmp_path, cache_dir, f"sqlite:///{tmp_path / 'polar.db'}")
    factory = store_factory(settings)
    (theirs,) = await asyncio.to_thread(submit_tasks, factory, [answer_task()], dispatcher="api:elsewhere")
    ids = list(theirs.rollout_ids)

    outcomes = await dispatch_rollouts(ids, dispatch=Dispatch.INLINE, settings=settings, dispatcher="batch:here")
    assert list(outcomes) == ids
    assert all(
        o == f"{NOT_DISPATCHED}: task {theirs.task_id} is dispatched by another runner (api:elsewhere)"
        for o in outcomes.values()
    )
    assert all(rollout_row(factory, r).attempt == 0 for r in ids)  # never claimed: nothing ran
    summary = await asyncio.to_thread(summarize, factory, ids, outcomes)
    assert summary["not_run"] == outcomes and summary["counts"] == {"PENDING": 2}


def test_a_rollout_another_flow_run_held_counts_as_not_run_here():
    """The outcome of a rollout flow that met another owner's claim is not run here; a stage failure is."""
    claimed = _outcome(RolloutClaimed("rollout r is owned by flow run f (heartbeat 0.1 s ago)", field="rollout_id"))
    assert run_elsewhere(claimed) and "owned by flow run f" in claimed
    assert not run_elsewhere(_outcome({"status": "COMPLETED"})) and not run_elsewhere(_outcome(RuntimeError("boom")))
