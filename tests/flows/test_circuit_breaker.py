"""The batch's circuit breaker: 20 tasks whose verifier crashes stop after POLAR_BATCH_MAX_CONSECUTIVE_ERRORS
rollouts failed for good in a row; those are ERROR with their cause (no reward), the rest are cancelled with the
breaker's message, and the batch raises ``BatchStopped``; the same with deployment dispatch."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.states import Failed

from db.enums import RolloutStatus
from db.models import Rollout, Task
from flows.batch import rollout_batch
from flows.dispatch import Dispatch, dispatch_rollouts
from flows.rollout import rollout
from harness_adapters import ADAPTERS
from harness_adapters.base import HarnessContext, LaunchSpec, ModelCalls, RoleHints, SessionAccess
from harness_adapters.command import CommandConfig
from polar.errors import BatchStopped
from polar.rollout import submit_tasks
from polar.rollout.context import store_factory
from polar.settings import TaskDispatch
from tests.rollout.helpers import answer_task, test_settings


def broken_task(index: int) -> dict:
    return {
        "name": f"broken-{index:02d}",
        "instruction": "Do nothing.",
        "harness": {"name": "command", "config": {"command": "true"}},
        "evaluator": {"type": "script", "config": {"script": "echo verifier crashed >&2; exit 2"}},
    }


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_batch_of_broken_tasks_stops_after_n_infrastructure_errors(flow_env):
    flow_env(POLAR_EVALUATE_RETRIES="0", POLAR_BATCH_MAX_CONSECUTIVE_ERRORS="3", POLAR_BATCH_MAX_ACTIVE="1")
    with pytest.raises(BatchStopped, match=r"3 rollouts in a row failed .* 17 unstarted rollout\(s\) cancelled"):
        await rollout_batch(tasks=[broken_task(i) for i in range(20)])
    with store_factory()() as db:
        rows = db.scalars(sa.select(Rollout).where(Rollout.error.is_not(None))).all()
    statuses = sorted(row.status.value for row in rows)
    assert statuses == ["CANCELLED"] * 17 + ["ERROR"] * 3
    for row in rows:
        if row.status is RolloutStatus.ERROR:
            assert row.reward is None and "evaluate failed" in row.error and "exit code 2" in row.error
        else:
            assert row.error.startswith("batch stopped: 3 rollouts in a row") and row.reward is None


async def test_a_deployment_batch_stops_too_and_its_unstarted_flow_runs_are_cancelled(
    tmp_path, cache_dir, sqlite_url, prefect_server
):
    """Deployment dispatch, no worker serving the pool: three of the batch's flow runs end Failed (as a rollout
    flow does when a stage failed for good); the batch cancels the five no worker has started, in the store and in
    Prefect, and raises ``BatchStopped``."""
    deployment_id = await (await rollout.to_deployment(name="breaker-test")).apply()
    settings = test_settings(
        tmp_path,
        cache_dir,
        sqlite_url,
        rollout_deployment=f"{rollout.name}/breaker-test",
        task_dispatch=TaskDispatch.DEPLOYMENT,
        batch_max_consecutive_errors=3,
    )
    factory = store_factory(settings)
    (batch,) = await asyncio.to_thread(
        submit_tasks, factory, [answer_task(name="breaker", samples=8)], dispatcher="test-batch"
    )
    ids = list(batch.rollout_ids)
    waiting = asyncio.create_task(
        dispatch_rollouts(ids, dispatch=Dispatch.DEPLOYMENT, settings=settings, dispatcher="test-batch")
    )
    async with get_client() as client:
        runs: list = []
        for _ in range(100):
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
            if len(runs) == len(ids):
                break
            await asyncio.sleep(0.2)
        assert len(runs) == len(ids)
        failed = {run.parameters["rollout_id"] for run in runs[:3]}
        for run in runs[:3]:
            await client.set_flow_run_state(run.id, Failed(message="evaluate failed: exit code 2"), force=True)
        with pytest.raises(BatchStopped, match=r"3 rollouts in a row failed .* 5 unstarted rollout\(s\) cancelled"):
            await asyncio.wait_for(waiting, 60)
        states = {
            run.parameters["rollout_id"]: run.state.type.value
            for run in await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
        }
        assert {states[rid] for rid in failed} == {"FAILED"}
        assert {state for rid, state in states.items() if rid not in failed} == {"CANCELLED"}
        for run in runs:
            await client.delete_flow_run(run.id)
        await client.delete_deployment(deployment_id)
    with factory() as db:
        rows = {row.id: row for row in db.scalars(sa.select(Rollout).where(Rollout.id.in_(ids)))}
    cancelled = [rid for rid in ids if rows[rid].status is RolloutStatus.CANCELLED]
    assert sorted(cancelled) == sorted(set(ids) - failed)
    assert all(rows[rid].error.startswith("batch stopped: 3 rollouts in a row") for rid in cancelled)


class SilentAgent:
    """An agent that exits 0 without calling the model, as a CLI that crashes on its own error and exits 0 does."""

    name = "silent"
    Config = CommandConfig
    role_hints = RoleHints()

    def model_calls(self, config: CommandConfig) -> ModelCalls:
        return ModelCalls.REQUIRED

    def setup_files(self, config: CommandConfig, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def launch(self, config: CommandConfig, ctx: HarnessContext, session: SessionAccess) -> LaunchSpec:
        return LaunchSpec(argv=("true",))


def unstartable_task(index: int) -> dict:
    """Every other task's harness is not in the runtime (exit 127); the others' agent never calls the model."""
    harness = (
        {"name": "command", "config": {"command": ["/opt/no-such-harness/bin/agent"]}}
        if index % 2
        else {"name": "silent", "config": {"command": "unused"}}
    )
    evaluator = {"type": "script", "config": {"script": "exit 0"}}
    return {
        "name": f"unstartable-{index:02d}",
        "instruction": "Do the task.",
        "harness": harness,
        "evaluator": evaluator,
    }


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_harnesses_that_cannot_start_or_never_call_the_model_are_infrastructure_errors(flow_env, monkeypatch):
    """Neither is a scored sample: each rollout is ERROR with the cause and no reward, and the breaker counts them."""
    monkeypatch.setitem(ADAPTERS, "silent", SilentAgent())
    flow_env(POLAR_BATCH_MAX_CONSECUTIVE_ERRORS="4", POLAR_BATCH_MAX_ACTIVE="1")
    with pytest.raises(BatchStopped, match=r"4 rollouts in a row failed .* 4 unstarted rollout\(s\) cancelled"):
        await rollout_batch(tasks=[unstartable_task(i) for i in range(8)])
    with store_factory()() as db:
        mine = sa.select(Task.id).where(Task.name.startswith("unstartable-"))
        failed = db.scalars(
            sa.select(Rollout).where(Rollout.status == RolloutStatus.ERROR, Rollout.task_id.in_(mine))
        ).all()
    causes = sorted(row.error.split(": ", 2)[1] for row in failed)
    assert causes == ["the harness could not start"] * 2 + ["the harness exited 0 without a model call"] * 2, causes
    for row in failed:
        assert row.reward is None and row.error.startswith("run failed")
        ended = row.results.run_progress.ended  # the end as recorded: a retry of the stage raises it again
        assert ended is not None and ended.infra_error is not None and ended.infra_error in row.error
