"""``polar retry --stale-after S`` takes over a rollout whose owner has been silent S seconds, even while the Prefect
server still has the owner's flow run Running (its worker died and never reported the end), without waiting for
the fleet's ``POLAR_STALE_AFTER_S`` (600 s here). A live owner is still safe: a silence shorter than a few
heartbeats never counts (``flows.owners.LIVE_BEATS``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import sqlalchemy as sa
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Running

from db.enums import RolloutStatus
from db.models import Rollout
from flows.retry import retry_failed
from polar.rollout import state, submit_tasks
from polar.rollout.context import store_factory
from tests.rollout.helpers import answer_task, rollout_row

SILENT_S = 60.0


@flow(name="polar-test-dead-owner")
def dead_owner() -> None:
    """Never run: its flow run is created Running, as a killed worker's run stays on the server."""


async def _running_flow_run() -> str:
    async with get_client() as client:
        run = await client.create_flow_run(dead_owner, state=Running())
    return str(run.id)


async def test_a_retry_honours_its_stale_after_for_a_run_prefect_still_has_running(flow_env):
    flow_env(POLAR_STALE_AFTER_S="600")
    factory = store_factory()
    (rid,) = (await asyncio.to_thread(submit_tasks, factory, [answer_task(samples=1)]))[0].rollout_ids
    owner = await _running_flow_run()
    await asyncio.to_thread(state.claim, factory, rid, owner, default_timeout_s=600, stale_after_s=600)
    with factory() as db, db.begin():
        silent = state.now() - timedelta(seconds=SILENT_S)
        db.execute(sa.update(Rollout).where(Rollout.id == rid).values(heartbeat_at=silent))

    # Silent for less than this retry's --stale-after: left alone.
    patient = await retry_failed(rollout_ids=[rid], stale_after_s=SILENT_S * 10)
    assert patient["retried"] == [] and rollout_row(factory, rid).flow_run_id == owner

    result = await retry_failed(rollout_ids=[rid], stale_after_s=SILENT_S / 2)
    assert result["retried"] == [rid] and result["rollouts"][rid]["flow"] == "ok", result
    row = rollout_row(factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.flow_run_id != owner and row.attempt == 2
    async with get_client() as client:  # the dead owner's run is marked Crashed, so Prefect tells the same story
        crashed = await client.read_flow_run(owner)
    assert crashed.state is not None and crashed.state.is_crashed(), crashed.state
