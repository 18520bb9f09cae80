"""What the routes of ``polar serve-model`` share: the engine, the runs in flight and the last abort's reason, on
``app.state.sglang``; and the one way they read a JSON body."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from polar.errors import InvalidRequest
from polar.models.engine import LocalEngine
from polar.serving.sglang_run import GenerationRun
from polar.serving.sglang_wire import prepare_generate


class ServerState:
    """What the routes share: the engine, the runs in flight (by rid) and the reason of the last abort."""

    def __init__(
        self, engine: LocalEngine, served_model_name: str, incremental_streaming: bool, routed_experts: bool = False
    ):
        self.engine = engine
        self.served_model_name = served_model_name
        self.incremental_streaming = incremental_streaming
        self.routed_experts = routed_experts  # --enable-return-routed-experts
        self.runs: dict[str, GenerationRun] = {}
        self.abort_message = "Aborted."

    def new_run(self, raw: object) -> GenerationRun:
        engine = self.engine
        prepared = prepare_generate(
            raw,
            tokenizer_encode=engine.tokenizer.encode,
            vocab_size=engine.model.config.vocab_size,
            context_length=engine.context_length,
            routed_experts_enabled=self.routed_experts,
        )
        if prepared.rid in self.runs:
            raise InvalidRequest(f"request id {prepared.rid!r} is already in flight", field="rid")
        engine.validate(prepared.request)  # before any byte is streamed, so errors get a status code
        return GenerationRun(
            engine, prepared, incremental=self.incremental_streaming, abort_message=lambda: self.abort_message
        )

    def abort_all(self, message: str) -> int:
        self.abort_message = message
        return self.engine.abort_all(message)


def server_state(request: Request) -> ServerState:
    return request.app.state.sglang  # type: ignore[no-any-return]


async def read_json(request: Request, *, empty_ok: bool = False) -> Any:
    raw = await request.body()
    if not raw.strip() and empty_ok:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", field="body") from None
