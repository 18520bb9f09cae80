"""Reading what the Prefect server recorded (flow runs by name, their task runs), with polling: task-run records
arrive through events, a moment after the flow returns."""

from __future__ import annotations

import asyncio

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)


async def flow_runs_named(name: str):
    async with get_client() as client:
        return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


async def task_runs_of(flow_run_id, *, expect: int, timeout_s: float = 20.0):
    """The task runs of a flow run once ``expect`` of them are recorded in a final state."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with get_client() as client:
        while True:
            runs = await client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
            )
            final = [r for r in runs if r.state is not None and r.state.is_final()]
            if len(final) >= expect or asyncio.get_running_loop().time() > deadline:
                return sorted(final, key=lambda r: r.expected_start_time or r.created)
            await asyncio.sleep(0.5)
