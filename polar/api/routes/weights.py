"""``/v1/weights``: the registered weight versions, and publishing a new one (pushed to every gateway first,
then registered as current: ``polar.api.weights``)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from polar import feed
from polar.api.deps import CONTROL, StateDep, StoreDep
from polar.api.error_handlers import ERROR_RESPONSES
from polar.api.schemas import Published, PushView, Versions, VersionView, WeightsRequest
from polar.api.weights import live_gateways, publish, weight_source, weight_targets
from polar.feed.versions import VersionRecord

router = APIRouter(prefix="/v1/weights", tags=["weights"], dependencies=CONTROL, responses=ERROR_RESPONSES)


def _version(record: VersionRecord) -> dict[str, object]:
    return {**asdict(record), "created_at": record.created_at.isoformat()}


@router.get("")
async def weights(store: StoreDep) -> Versions:
    rows = await store.call(feed.list_versions, store.factory)
    return Versions(
        versions=[VersionView.model_validate(_version(r)) for r in rows], current=rows[-1].version if rows else None
    )


@router.post(
    "",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {"schema": WeightsRequest.model_json_schema()},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            }
        }
    },
)
async def register_weights(request: Request, state: StateDep) -> Published:
    """JSON ``{version, checkpoint_path?, notes?}``, or one safetensors file's bytes with ``?version=``."""
    source = await weight_source(request)
    registered = await state.store.call(live_gateways, state.store.factory, state.settings)
    targets = weight_targets(state.settings, state.gateway_url, registered)
    record, pushes = await publish(
        state.store.factory,
        targets,
        source,
        state.token,
        attempts=state.settings.weight_push_attempts,
        store_timeout_s=state.store.timeout_s,
    )
    state.wake.set()  # tasks held by admission control may start now
    return Published.model_validate(
        {**_version(record), "targets": targets, "pushes": [PushView.model_validate(asdict(p)) for p in pushes]}
    )
