"""Maintenance flows: rebuild stored trajectories with a builder (``polar trajectories rebuild`` as a flow)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from prefect import flow

from polar.rollout.context import get_store
from polar.trajectory import rebuild


@flow(name="polar-rebuild-trajectories", flow_run_name="rebuild-{builder}", persist_result=False)
async def rebuild_trajectories(
    builder: str = "prefix_merge", rollout_id: str | None = None, task_id: str | None = None, since: str | None = None
) -> dict[str, Any]:
    """Rebuild the trajectories of one rollout, a task, or every rollout created since an ISO date (UTC if naive)."""
    factory = await get_store()
    when = datetime.fromisoformat(since) if since else None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    report = await asyncio.to_thread(
        rebuild, factory, builder=builder, rollout_id=rollout_id, task_id=task_id, since=when
    )
    return {
        "summary": report.summary(),
        "failed": [list(item) for item in report.failed],
        "skipped": len(report.skipped),
    }
