"""``polar serve-model``'s control routes, as SGLang answers them: weight updates and version labels, pausing and
continuing generation, flushing the prefix cache and aborting requests."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from polar.errors import PolarError
from polar.models.engine import PauseMode
from polar.serving.sglang_state import read_json, server_state
from polar.serving.sglang_wire import (
    AbortBody,
    PauseBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightVersionBody,
    parse_body,
)

logger = logging.getLogger(__name__)
router = APIRouter()


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> JSONResponse:
    state = server_state(request)
    engine = state.engine
    body = parse_body(await read_json(request), UpdateWeightsFromDiskBody)
    aborted = state.abort_all("Aborted for a weight update.") if body.abort_all_requests else 0
    version = body.weight_version if body.weight_version is not None else engine.weight_version
    try:
        await engine.load_weights(Path(body.model_path), version)
    except Exception as exc:  # noqa: BLE001 -- a bad checkpoint is the caller's problem: SGLang answers 400, success false
        logger.warning("update_weights_from_disk(%s) failed: %s", body.model_path, exc)
        message = exc.message if isinstance(exc, PolarError) else f"{type(exc).__name__}: {exc}"
        content = {"success": False, "message": f"Failed to update weights: {message}", "num_paused_requests": 0}
        return JSONResponse(content, status_code=400)
    message = "Succeeded to update model weights."
    if body.weight_version is not None:
        message += f" Weight version updated to {body.weight_version}."
    if body.abort_all_requests:
        message += f" Aborted {aborted} running requests."
    # Running requests are never paused here: they continue under the new weights (spans record it).
    # The engine always drops its shared prefix cache on a weight change, so flush_cache is implied.
    return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})


@router.post("/update_weight_version")
async def update_weight_version(request: Request) -> JSONResponse:
    state = server_state(request)
    engine = state.engine
    body = parse_body(await read_json(request), UpdateWeightVersionBody)
    if body.abort_all_requests:
        state.abort_all("Aborted for a weight version update.")
    await engine.relabel(body.new_version)
    return JSONResponse(
        {
            "success": True,
            "message": f"Weight version updated to {body.new_version}",
            "new_version": body.new_version,
        }
    )


@router.post("/pause_generation")
async def pause_generation(request: Request) -> JSONResponse:
    state = server_state(request)
    engine = state.engine
    raw = await read_json(request, empty_ok=True)
    body = parse_body(raw if raw is not None else {}, PauseBody)
    if PauseMode(body.mode) is PauseMode.ABORT:
        state.abort_message = "Aborted by pause_generation (mode=abort)."
    engine.pause(PauseMode(body.mode))
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
async def continue_generation(request: Request) -> JSONResponse:
    server_state(request).engine.resume()
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> PlainTextResponse:
    state = server_state(request)
    engine = state.engine
    # Like SGLang, refuse while requests run. Idle, the engine's worker thread does not touch the
    # prefix cache (it is only read or filled while a request runs), so clearing it here is safe.
    text = (
        "Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n"
    )
    if state.runs:
        return PlainTextResponse(text, status_code=400)
    engine.prefix_cache.clear()
    return PlainTextResponse(text)


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await read_json(request), AbortBody)
    if body.abort_all:
        state.abort_all("Aborted by abort_request (abort_all).")
    elif body.rid in state.runs:
        state.runs[body.rid].abort("Aborted by abort_request.")
    return Response(status_code=200)
