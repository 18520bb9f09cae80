"""Export fixtures: a store per backend with a small batch run through the real stages (built-in agent,
scripted tool calls, real captures and trajectories)."""

from __future__ import annotations

import asyncio

import pytest

from polar.rollout import process_limiter
from polar.rollout.pipeline import drive_rollouts
from polar.rollout.submit import submit_tasks
from tests.rollout.conftest import postgres_url, sqlite_url, store_context, store_url  # noqa: F401
from tests.rollout.helpers import answer_task


@pytest.fixture(scope="module")
def batch(store_context):
    """Two tasks of two samples (one solves, one fails) on the module's store; returns their task ids."""
    tasks = [
        answer_task(name="export-a", metadata={"split": "train"}),
        answer_task(name="export-b", metadata={"split": "test"}),
    ]
    submitted = submit_tasks(store_context.factory, tasks)
    ids = [r for t in submitted for r in t.rollout_ids]

    async def run() -> list:
        return await drive_rollouts(store_context, ids, "export", limiter=process_limiter(store_context.settings))

    results = asyncio.run(run())
    assert not [r for r in results if isinstance(r, BaseException)]
    return [t.task_id for t in submitted]
