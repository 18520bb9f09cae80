"""Two overlapping retry runs on a real Prefect server: the first takes a dead owner's rollout over and runs its
harness; the second, started while that harness runs (and told every rollout is stale), finds the rollout's flow
run running and leaves it alone: no second owner, no kill, and the rollout ends with its evaluator's reward."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from db.enums import RolloutStatus
from db.models import Rollout
from flows.retry import retry_failed
from polar.rollout import state, submit_tasks
from polar.rollout.context import store_factory
from tests.flows.test_flows import _alive
from tests.rollout.helpers import answer_task, captures, rollout_row, script


async def _until(condition, timeout_s: float, what: str):
    for _ in range(int(timeout_s / 0.1)):
        value = await asyncio.to_thread(condition)
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_second_retry_run_never_steals_or_kills_what_the_first_one_runs(flow_env, tmp_path: Path):
    flow_env(POLAR_RUNTIME_ISOLATION="none")  # the harness waits on a gate file the test holds on the host
    gate = tmp_path / "hold-harness"
    gate.touch()
    task = answer_task(
        samples=1, policies=[script(f"while [ -f {gate} ]; do sleep 0.1; done; echo polar > answer.txt")]
    )
    factory = store_factory()
    (rid,) = (await asyncio.to_thread(submit_tasks, factory, [task]))[0].rollout_ids
    # Its first owner died long ago (a driver without Prefect, silent for an hour).
    await asyncio.to_thread(state.claim, factory, rid, "dead-worker", default_timeout_s=600, stale_after_s=600)
    with factory() as db, db.begin():
        db.execute(sa.update(Rollout).where(Rollout.id == rid).values(heartbeat_at=state.now() - timedelta(hours=1)))

    first = asyncio.create_task(retry_failed(rollout_ids=[rid], stale_after_s=0))
    try:
        await _until(lambda: len(captures(factory, rid)) == 1, 120, "the first retry's harness to call")
        row = rollout_row(factory, rid)
        owner, harness = row.flow_run_id, row.stage_results["progress"]["run"]["process"]["pid"]
        assert owner != "dead-worker" and row.attempt == 2

        second = await retry_failed(rollout_ids=[rid], stale_after_s=0)
        assert second["retried"] == [rid]
        outcome = second["rollouts"][rid]["flow"]
        assert "RolloutClaimed" in outcome and "still running" in outcome, outcome
        row = rollout_row(factory, rid)
        assert row.flow_run_id == owner and row.attempt == 2  # still the first retry's
        assert _alive(harness) and row.closed_at is None  # not killed, its session not revoked
    finally:
        gate.unlink()
        result = await asyncio.wait_for(first, 180)
    assert result["rollouts"][rid]["flow"] == "ok"
    row = rollout_row(factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0
    assert row.stage_timings["run"]["attempts"] == 1 and len(captures(factory, rid)) == 2
