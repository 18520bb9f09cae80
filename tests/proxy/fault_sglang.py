"""A fake SGLang server for fault tests: its ``/model_info`` and a ``/generate`` whose answer a test's ``answer``
builds from the request body and the fault in force (``app.state.fault``, which the test switches between calls)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

INFO = {"weight_version": "w0", "max_context_length": 4096}

Answer = Callable[[dict[str, Any], str], Awaitable[Response]]


def meta_info(ids: list[int], *, final: bool = True, logprob: float = -0.5, **changes: Any) -> dict[str, Any]:
    """SGLang's ``meta_info`` for a chunk holding ``ids`` (each with ``logprob``; ``final``: the finishing chunk),
    with ``changes`` put over it."""
    meta: dict[str, Any] = {
        "id": "r",
        "finish_reason": {"type": "length", "length": len(ids)} if final else None,
        "prompt_tokens": 3,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": "w0",
        "weight_versions": [{"version": "w0", "start": 0, "end": len(ids)}],
        "e2e_latency": 0.01,
        "output_token_logprobs": [[logprob, i, None] for i in ids],
    }
    return {**meta, **changes}


def fault_sglang(answer: Answer, fault: str) -> FastAPI:
    """The app, starting with ``fault``; ``answer(body, fault)`` answers each ``/generate``."""
    app = FastAPI()
    app.state.fault = fault

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return INFO

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await answer(await request.json(), app.state.fault)

    return app
