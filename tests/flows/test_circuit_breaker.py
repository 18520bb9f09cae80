"""The batch's circuit breaker: 20 tasks whose verifier crashes stop after POLAR_BATCH_MAX_CONSECUTIVE_ERRORS
rollouts failed for good in a row; those are ERROR with their cause (no reward), the rest are cancelled with the
breaker's message, and the batch raises ``BatchStopped``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from db.enums import RolloutStatus
from db.models import Rollout
from flows.batch import rollout_batch
from polar.errors import BatchStopped
from polar.rollout.context import store_factory


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
