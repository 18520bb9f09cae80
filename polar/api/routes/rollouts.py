"""``/v1/rollouts/{rollout_id}``: one rollout with its evaluations, and its builds' token records."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter
from sqlalchemy.orm import Session

from db.models import MergeStat, Rollout
from polar.api import queries
from polar.api.deps import CONTROL, StoreDep
from polar.api.error_handlers import ERROR_RESPONSES
from polar.api.schemas import RolloutDetail, RolloutStats, TokenRecord
from polar.errors import NotFound

router = APIRouter(prefix="/v1/rollouts", tags=["rollouts"], dependencies=CONTROL, responses=ERROR_RESPONSES)


def _detail(db: Session, rollout_id: str) -> RolloutDetail:
    row = db.get(Rollout, rollout_id)
    if row is None:
        raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
    return RolloutDetail.model_validate(
        {**queries.rollout_view(row), "evaluations": queries.evaluations_view(db, rollout_id)}
    )


def _stats(db: Session, rollout_id: str) -> RolloutStats:
    if db.get(Rollout, rollout_id) is None:
        raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
    rows = db.scalars(sa.select(MergeStat).where(MergeStat.rollout_id == rollout_id).order_by(MergeStat.builder))
    builds = [
        TokenRecord.model_validate(
            {
                **{k: getattr(row, k) for k in TokenRecord.model_fields},
                "roots_by_role": row.roots_by_role or {},
                "root_causes": row.root_causes or {},
                "untrained_tokens": row.untrained_tokens or {},
            }
        )
        for row in rows
    ]
    return RolloutStats(rollout_id=rollout_id, builds=builds)


@router.get("/{rollout_id}")
async def rollout(rollout_id: str, store: StoreDep) -> RolloutDetail:
    return await store.read(_detail, rollout_id)


@router.get("/{rollout_id}/stats")
async def rollout_stats(rollout_id: str, store: StoreDep) -> RolloutStats:
    """Each build's token record of one rollout: sampled, trainable, and every untrained token by reason."""
    return await store.read(_stats, rollout_id)
