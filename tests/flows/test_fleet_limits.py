"""Fleet-wide stage limits on a real Prefect server: created idempotently by whoever needs them (the batch and
retry dispatch, the control API, a rollout flow that finds one missing), ``auto`` picks them whenever a Prefect
server is configured, process-local limits in a process pool warn, and deployment dispatch has no batch cap."""

from __future__ import annotations

import asyncio
import logging

import pytest
import sqlalchemy as sa
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled

from db.models import Rollout
from flows.dispatch import Dispatch, dispatch_rollouts
from flows.rollout import rollout
from polar.api.runner import TaskRunner
from polar.prefect_adapter import PREFIX, PrefectLimiter, ensure_limits
from polar.rollout import submit_tasks
from polar.rollout.context import store_factory
from polar.rollout.fleet_limits import limit_scope, warn_unbounded
from polar.rollout.limits import SLOTS
from polar.settings import LimitScope, Settings, TaskDispatch
from tests.rollout.conftest import sqlite_url  # noqa: F401
from tests.rollout.helpers import answer_task, test_settings


async def _limits() -> dict[str, tuple[int, int]]:
    """polar-* limit name -> (limit, active slots) on the server."""
    found = {}
    async with get_client() as client:
        for slot in SLOTS:
            try:
                limit = await client.read_global_concurrency_limit_by_name(PREFIX + slot)
            except ObjectNotFound:
                continue
            found[PREFIX + slot] = (limit.limit, limit.active_slots)
    return found


async def _drop_limits() -> None:
    async with get_client() as client:
        for slot in SLOTS:
            try:
                await client.delete_global_concurrency_limit_by_name(PREFIX + slot)
            except ObjectNotFound:
                pass


@pytest.fixture
def settings(tmp_path, cache_dir, sqlite_url, prefect_server):
    return test_settings(tmp_path, cache_dir, sqlite_url, stage_limits=LimitScope.PREFECT, run_concurrency=3)


async def test_limits_are_created_once_whoever_asks_first_and_resized_only_by_dispatchers(settings):
    await _drop_limits()
    # Three creators racing on an empty server: no error, one set of limits.
    await asyncio.gather(ensure_limits(settings), ensure_limits(settings), ensure_limits(settings, resize=False))
    sizes = {name: limit for name, (limit, _) in (await _limits()).items()}
    assert sizes == {"polar-ready": 8, "polar-init": 4, "polar-run": 3, "polar-postrun": 4}
    # A dispatcher (batch, retry, control API) resizes them to its settings; a rollout flow never does.
    await ensure_limits(settings.model_copy(update={"run_concurrency": 5}))
    assert (await _limits())["polar-run"][0] == 5
    await ensure_limits(settings, resize=False)
    assert (await _limits())["polar-run"][0] == 5


async def test_a_rollout_flow_that_finds_a_limit_missing_creates_it(settings):
    await _drop_limits()
    async with PrefectLimiter(settings).slot("run"):
        limits = await _limits()
        assert limits["polar-run"] == (3, 1)  # created from the settings, and this slot is held in it
    assert (await _limits())["polar-run"][1] == 0


def test_auto_counts_fleet_wide_exactly_when_a_prefect_server_is_configured(monkeypatch, settings, caplog):
    auto = settings.model_copy(update={"stage_limits": LimitScope.AUTO})
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert limit_scope(Settings(stage_limits=LimitScope.AUTO)) is LimitScope.PROCESS
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")  # Prefect's own variable
    assert limit_scope(Settings(stage_limits=LimitScope.AUTO)) is LimitScope.PREFECT
    assert limit_scope(auto.model_copy(update={"prefect_api_url": ""})) is LimitScope.PROCESS
    # Explicitly process-local limits where each rollout flow runs in a process of its own: a warning.
    process = settings.model_copy(update={"stage_limits": LimitScope.PROCESS})
    with caplog.at_level(logging.WARNING, logger="polar.rollout"):
        assert warn_unbounded(process, "test process pool") is not None
    assert "bound nothing" in caplog.text and "POLAR_STAGE_LIMITS=prefect" in caplog.text
    assert warn_unbounded(settings, "test process pool") is None


async def _flow_runs_of(deployment_id) -> list:
    async with get_client() as client:
        return await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )


async def test_deployment_dispatch_creates_every_flow_run_at_once_and_the_control_api_makes_the_limits(settings):
    """No worker serves the pool here: the flow runs stay scheduled, which is what shows the batch cap gone."""
    deployment_id = await (await rollout.to_deployment(name="fleet-test")).apply()
    name = f"{rollout.name}/fleet-test"
    settings = settings.model_copy(
        update={"batch_max_active": 1, "rollout_deployment": name, "task_dispatch": TaskDispatch.DEPLOYMENT}
    )
    factory = store_factory(settings)
    (batch,) = await asyncio.to_thread(
        submit_tasks, factory, [answer_task(name="fleet-batch", samples=3)], dispatcher="test-batch"
    )
    waiting = asyncio.create_task(
        dispatch_rollouts(
            list(batch.rollout_ids), dispatch=Dispatch.DEPLOYMENT, settings=settings, dispatcher="test-batch"
        )
    )
    for _ in range(100):
        if len(await _flow_runs_of(deployment_id)) == 3:
            break
        await asyncio.sleep(0.2)
    runs = await _flow_runs_of(deployment_id)
    assert len(runs) == 3 and not waiting.done()  # all three at once, though POLAR_BATCH_MAX_ACTIVE is 1
    async with get_client() as client:  # end them (no worker would): the batch sees each one's end
        for run in runs:
            await client.set_flow_run_state(run.id, Cancelled(), force=True)
    outcomes = await asyncio.wait_for(waiting, 30)
    assert set(outcomes) == set(batch.rollout_ids)
    assert all("ended Cancelled" in outcome for outcome in outcomes.values())

    await _drop_limits()
    runner = TaskRunner(settings, factory)
    (task,) = await asyncio.to_thread(submit_tasks, factory, [answer_task(name="fleet-api", samples=2)])
    assert task.task_id in await runner.tick()
    assert set(await _limits()) == {PREFIX + slot for slot in SLOTS}  # made before its first flow run
    with factory() as db:
        dispatched = db.scalars(sa.select(Rollout.dispatch_id).where(Rollout.task_id == task.task_id)).all()
    assert len(dispatched) == 2 and all(dispatched)
    async with get_client() as client:
        for run in await _flow_runs_of(deployment_id):
            await client.delete_flow_run(run.id)
        await client.delete_deployment(deployment_id)
        assert not await client.read_deployments(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    await runner.aclose()
