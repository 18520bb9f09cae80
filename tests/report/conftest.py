"""Analysis fixtures: the export batch (two tasks, a solved and a failed sample each) plus a task whose harness
crashes, so the failure views have a row."""

from __future__ import annotations

import asyncio

import pytest

from polar.rollout import process_limiter
from polar.rollout.pipeline import drive_rollouts
from polar.rollout.submit import submit_tasks
from tests.export.conftest import batch, postgres_url, sqlite_url, store_context, store_url  # noqa: F401
from tests.rollout.helpers import answer_task


@pytest.fixture(scope="module")
def crashed(store_context, batch):
    task = answer_task(
        name="crash", samples=1, policies=None, harness={"name": "command", "config": {"command": "exit 3"}}
    )
    [submitted] = submit_tasks(store_context.factory, [task])

    async def run() -> list:
        return await drive_rollouts(
            store_context, list(submitted.rollout_ids), "crash", limiter=process_limiter(store_context.settings)
        )

    asyncio.run(run())
    return submitted.task_id
