"""Request bodies under a size limit, for the gateway and the control API.

A body larger than the limit is a ``PayloadTooLarge`` (413), refused from its declared length when it has one,
otherwise as soon as the bytes read pass the limit, so an oversize upload is never held in memory whole. A caller
that hangs up mid-body is a ``ClientClosed``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from polar.errors import ClientClosed, InvalidRequest, PayloadTooLarge
from polar.wire.json_guard import DEFAULT_LIMITS, JsonLimits, parse_json

MAX_WEIGHT_BYTES = 2 * 1024**3
"""The largest safetensors upload of new weights (``POST /v1/admin/weights``, ``POST /v1/weights``)."""


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit", field="body")
    raw = bytearray()
    try:
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit", field="body")
    except ClientDisconnect:
        raise ClientClosed(f"the caller hung up after {len(raw)} bytes of its request body", field="body") from None
    return bytes(raw)


OFFLOAD_BYTES = 256 * 1024
"""Bodies at least this large are decoded in a worker thread, so one big body does not stall other sessions."""


async def read_json(request: Request, limit: int, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """The body as JSON, checked against ``limits`` (``polar.wire.json_guard``); a bad body is a 400."""
    raw = await read_body(request, limit)
    if len(raw) >= OFFLOAD_BYTES:
        return await asyncio.to_thread(parse_json, raw, limits)
    return parse_json(raw, limits)


def tensor_upload_version(request: Request) -> str | None:
    """The ``?version=`` of a weights upload sent as safetensors bytes; None when the body is JSON instead."""
    if not request.headers.get("content-type", "").startswith("application/octet-stream"):
        return None
    version = request.query_params.get("version", "")
    if not version:
        raise InvalidRequest("a tensor upload needs ?version=", field="version")
    return version


class FastJSONResponse(JSONResponse):
    """A JSON response serialised once by orjson (the standard encoder for what orjson refuses)."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except TypeError:
            return super().render(content)
