"""What a trainer calls: ``GET /v1/model`` (the served model and its tokenizer, which the trainer's must match)
and the feed, ``/v1/claims``: claim complete groups under a lease, then ack (consume), release or renew it."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from fastapi import APIRouter

from polar import feed
from polar.api.deps import CONTROL, SettingsDep, StoreDep
from polar.api.error_handlers import ERROR_RESPONSES
from polar.api.schemas import (
    Acked,
    ClaimedBatch,
    ClaimRequest,
    ModelInfo,
    Released,
    Renewed,
    RenewRequest,
    TokenizerInfo,
    TrainerBody,
)
from polar.models.tiny import named_tokenizer
from polar.settings import Settings
from polar.tokens.tokenizer import ChatTokenizer

router = APIRouter(prefix="/v1", tags=["trainer"], dependencies=CONTROL, responses=ERROR_RESPONSES)


def model_tokenizer(settings: Settings) -> ChatTokenizer:
    """The tokenizer every gateway with ``settings`` renders prompts with (``polar.proxy.gateway`` picks it so)."""
    return named_tokenizer(settings.model, settings.cache_dir)


@router.get("/model")
async def model(settings: SettingsDep) -> ModelInfo:
    """The model the gateways serve under these settings and its tokenizer (trainers check theirs matches)."""
    tokenizer = await asyncio.to_thread(model_tokenizer, settings)
    return ModelInfo(
        model=settings.model,
        tokenizer=TokenizerInfo(
            name=tokenizer.name, vocab_size=tokenizer.vocab_size, fingerprint=tokenizer.fingerprint
        ),
    )


@router.post("/claims")
async def claim(body: ClaimRequest, store: StoreDep, settings: SettingsDep) -> ClaimedBatch:
    batch = await store.call(
        feed.claim,
        store.factory,
        body.trainer,
        max_groups=body.max_groups,
        lease_s=body.lease_s or settings.claim_lease_s,
        max_staleness=body.max_staleness,
        min_samples=settings.claim_min_samples,
    )
    expires = batch.lease_expires_at.isoformat() if batch.lease_expires_at else None
    return ClaimedBatch.model_validate({**asdict(batch), "lease_expires_at": expires})


@router.post("/claims/{claim_id}/ack")
async def ack(claim_id: str, body: TrainerBody, store: StoreDep) -> Acked:
    return Acked.model_validate(await store.call(feed.ack, store.factory, claim_id, body.trainer))


@router.post("/claims/{claim_id}/release")
async def release(claim_id: str, body: TrainerBody, store: StoreDep) -> Released:
    return Released.model_validate(await store.call(feed.release, store.factory, claim_id, body.trainer))


@router.post("/claims/{claim_id}/renew")
async def renew(claim_id: str, body: RenewRequest, store: StoreDep) -> Renewed:
    until = await store.call(feed.renew, store.factory, claim_id, body.trainer, body.lease_s)
    return Renewed(claim_id=claim_id, lease_expires_at=until.isoformat())
