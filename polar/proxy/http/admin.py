"""The gateway's admin routes: ``GET /metrics`` (Prometheus text), and ``POST /v1/admin/weights``, which loads new
policy weights into its backend.

The weights route takes two bodies: JSON ``{"version": ..., "checkpoint_path": ...}`` (a safetensors folder the
backend can read; no path relabels the live weights), or the bytes of one safetensors file (``Content-Type:
application/octet-stream``) with ``?version=...``, which only the in-process local backend can take. The backend
pauses generations in flight rather than aborting them, so they finish under the new weights with
version spans (``Backend.update_weights``). Needs the control token when one is configured; session keys are
refused.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar import metrics
from polar.errors import InvalidRequest, PolarError, invalid_from
from polar.httpserve.body import MAX_WEIGHT_BYTES, read_body, read_json, tensor_upload_version
from polar.inference import WeightUpdate
from polar.proxy.http.errors import error_response
from polar.proxy.http.route_table import Route
from polar.proxy.http.served import authorize_control, require_control, served


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


async def update_weights(request: Request, route: Route) -> Response:
    gw = served(request).gateway
    try:
        await authorize_control(request)
        update = await parse_weight_update(request, gw.settings.max_body_bytes)
        await gw.backend.update_weights(update)
        version = await gw.backend.weight_version()
    except PolarError as exc:
        return error_response(route.protocol, exc)
    return JSONResponse({"weight_version": version, "backend": gw.backend.name})


async def prometheus(request: Request, route: Route) -> Response:
    """Prometheus text format (``polar.metrics``); the control token as Bearer, like every control route."""
    try:
        require_control(request)
    except PolarError as exc:
        return error_response(route.protocol, exc)
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)
