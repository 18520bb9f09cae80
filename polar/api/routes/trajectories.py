"""``/v1/trajectories``: trajectories by the exports' filters (``polar.export.filters``), and one trajectory's
extras (top-k logprobs, routed experts)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path, Query

from polar.api import queries
from polar.api.deps import CONTROL, StoreDep
from polar.api.error_handlers import ERROR_RESPONSES
from polar.api.schemas import TrajectoryExtrasView, TrajectoryList
from polar.export.filters import ExportFilter
from polar.trajectory.extras import trajectory_extras_view

router = APIRouter(prefix="/v1/trajectories", tags=["trajectories"], dependencies=CONTROL, responses=ERROR_RESPONSES)
# Row ids are 64-bit integers in both stores: a larger id is a 400 naming the field, not a 500 from the driver.
MAX_ROW_ID = 2**63 - 1


# Unset keys are left out: the token arrays are there only with tokens=true.
@router.get("", response_model_exclude_unset=True)
async def trajectories(
    store: StoreDep,
    task_id: str | None = None,
    rollout_id: str | None = None,
    builder: str | None = None,
    status: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    weight_version: str | None = None,
    since: datetime | None = None,
    consumed: bool | None = None,
    include_scripted: bool = Query(False, description="also trajectories of scripted policies (never trainable)"),
    tokens: bool = Query(False, description="include token arrays"),
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=1_000_000_000),
) -> TrajectoryList:
    filters = ExportFilter(
        task_ids=[task_id] if task_id is not None else None,
        rollout_id=rollout_id,
        builder=builder,
        all_builders=True,
        status=[status] if status is not None else None,
        min_reward=min_reward,
        max_reward=max_reward,
        weight_version=weight_version,
        since=since,
        consumed=consumed,
        include_scripted=include_scripted,
    )
    rows = await store.read(queries.list_trajectories, filters, limit=limit, offset=offset, tokens=tokens)
    return TrajectoryList.model_validate({"trajectories": rows})


@router.get("/{trajectory_id}/extras")
async def trajectory_extras(store: StoreDep, trajectory_id: int = Path(ge=1, le=MAX_ROW_ID)) -> TrajectoryExtrasView:
    """Top-k logprobs and routed experts of one trajectory (polar.trajectory.extras), null where not captured."""
    return TrajectoryExtrasView.model_validate(await store.read(trajectory_extras_view, trajectory_id))
