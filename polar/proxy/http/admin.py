"""The gateway's weight endpoint: ``POST /v1/admin/weights`` loads new policy weights into its backend.

Two bodies: JSON ``{"version": ..., "checkpoint_path": ...}`` (a safetensors folder the backend can read; no
path relabels the live weights), or the bytes of one safetensors file (``Content-Type:
application/octet-stream``) with ``?version=...``, which only the in-process local backend can take. The
backend pauses generations in flight rather than aborting them, so they finish under the new weights with
version spans (``Backend.update_weights``). Needs the control token when one is configured; session keys are
refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar.errors import InvalidRequest, PolarError, invalid_from
from polar.inference import WeightUpdate
from polar.proxy.gateway import Gateway
from polar.wire.body import MAX_WEIGHT_BYTES, read_body, read_json, tensor_upload_version


class WeightsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=128)
    checkpoint_path: str | None = Field(default=None, min_length=1)


async def parse_weight_update(request: Request, limit: int) -> WeightUpdate:
    version = tensor_upload_version(request)
    if version is not None:
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            tensors = load(await read_body(request, MAX_WEIGHT_BYTES))
        except (SafetensorError, ValueError) as exc:
            raise InvalidRequest(f"the body is not a safetensors file: {exc}", field="body") from None
        return WeightUpdate(version, tensors=tensors)
    raw = await read_json(request, limit)
    try:
        body = WeightsBody.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise invalid_from(exc, "weights request") from None
    return WeightUpdate(body.version, path=body.checkpoint_path)


def add_admin_routes(
    app: FastAPI,
    gw: Gateway,
    authorize: Callable[[Request], Awaitable[None]],
    on_error: Callable[[PolarError], Response],
) -> None:
    @app.post("/v1/admin/weights")
    async def update_weights(request: Request) -> Response:
        try:
            await authorize(request)
            update = await parse_weight_update(request, gw.settings.max_body_bytes)
            await gw.backend.update_weights(update)
            version = await gw.backend.weight_version()
        except PolarError as exc:
            return on_error(exc)
        return JSONResponse({"weight_version": version, "backend": gw.backend.name})
