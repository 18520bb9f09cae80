"""A store holding every state the capture writer can leave behind, built through the real gateway.

A fake SGLang server (real HTTP, SGLang's ``/generate`` wire) answers each call as its ``fault`` says: a normal
reply, an empty output, an out-of-vocabulary id, a NaN logprob, an HTTP 500 or a stall past the gateway's
deadline. Sessions (gateway-only rollouts) are driven through the gateway's OpenAI route:

- per fault, a session whose only call fails and one where a call fails between two good ones;
- a poisoned chain (an edited reply makes a call ``unresolved``, and the call after it stays poisoned);
- legacy empty outputs: OK captures with no output ids, as the gateway stored them before an empty output was an
  error (the output check's empty rule switched off for those calls);
- an UNACKNOWLEDGED and an INTERRUPTED capture (the states the acknowledgement and relaunch paths set);
- a session with no captures, and one left open (its rollout unfinished).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from db import make_engine, make_session_factory, session_scope
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout
from polar.backends.sglang import SGLangBackend
from polar.proxy.call.output_check import OutputCheck
from polar.serving.threaded import ServerThread
from polar.settings import Settings
from tests.proxy.asgi_gateway import CONTROL, asgi_gateway, open_session
from tests.proxy.fault_sglang import INFO, fault_sglang, meta_info
from tests.proxy.gateway_server import settings_for

STALL_S = 5.0
DEADLINE_S = 1.0
FAULTS = ("empty", "negative_id", "nan_logprob", "server_error", "stall")
OK_IDS = [100, 101, 102]


def fake_sglang() -> FastAPI:
    """SGLang's ``/generate``, answering as ``app.state.fault`` says (``ok`` or one of ``FAULTS``)."""
    return fault_sglang(_answer, "ok")


async def _answer(body: dict[str, Any], fault: str) -> Response:
    if fault == "server_error":
        return Response("engine exploded", status_code=500)
    if fault == "stall":
        await asyncio.sleep(STALL_S)
    ids = {"empty": [], "negative_id": [100, -3]}.get(fault, OK_IDS)
    logprob = float("nan") if fault == "nan_logprob" else -0.5
    payload = {"text": "", "output_ids": ids, "meta_info": meta_info(ids, logprob=logprob)}
    if not body["stream"]:
        return Response(json.dumps(payload), media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        yield b"data: " + json.dumps(payload).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@dataclass
class FaultStore:
    """The store and what each named session became (``sessions``: name -> rollout id)."""

    settings: Settings
    url: str
    factory: sessionmaker[Session]
    sessions: dict[str, str] = field(default_factory=dict)


class _Driver:
    """Calls through the gateway as one harness would: its conversation grows with each reply it receives."""

    def __init__(self, client: httpx.AsyncClient, app: FastAPI):
        self.client, self.app = client, app

    async def session(self) -> tuple[str, dict[str, str]]:
        opened = await open_session(self.client)
        return opened["session_id"], {"Authorization": f"Bearer {opened['api_key']}"}

    async def call(
        self, key: dict[str, str], messages: list[dict[str, Any]], fault: str = "ok", *, stream: bool = False
    ) -> str | None:
        """One call; the reply's text, or None when the gateway answered an error (in a stream: an error event)."""
        self.app.state.fault = fault
        body = {"model": "tiny", "max_tokens": 8, "stream": stream, "messages": messages}
        reply = await self.client.post("/v1/chat/completions", json=body, headers=key)
        if reply.status_code != 200:
            assert reply.status_code in (502, 503, 504), reply.text
            return None
        if stream:
            assert '"error"' in reply.text, reply.text  # a fault in a stream is an in-protocol error event
            return None
        return str(reply.json()["choices"][0]["message"]["content"] or "")

    async def close(self, session_id: str) -> None:
        reply = await self.client.post(f"/v1/sessions/{session_id}/close", headers=CONTROL)
        assert reply.status_code == 200, reply.text


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def _drive(driver: _Driver, store: FaultStore) -> None:
    named = store.sessions

    async def conversation(name: str, faults: list[str], *, stream: bool = False, close: bool = True) -> None:
        sid, key = await driver.session()
        named[name] = sid
        messages = [_user(f"{name}: begin")]
        for index, fault in enumerate(faults):
            text = await driver.call(key, messages, fault, stream=stream and fault != "ok")
            if text is not None:  # a failed call is retried by the harness with the same history
                messages += [{"role": "assistant", "content": text}, _user(f"{name}: step {index}")]
        if close:
            await driver.close(sid)

    for fault in FAULTS:
        await conversation(f"{fault}-only", [fault])
        await conversation(f"{fault}-between", ["ok", fault, "ok"])
    await conversation("empty-stream", ["ok", "empty", "ok"], stream=True)

    sid, key = await driver.session()  # an edited reply: the call is unresolved, its chain poisoned from there on
    named["poisoned"] = sid
    first = [_user("poisoned: begin")]
    said = await driver.call(key, first)
    edited = [*first, {"role": "assistant", "content": f"{said} (edited)"}, _user("poisoned: go on")]
    said = await driver.call(key, edited)
    await driver.call(key, [*edited, {"role": "assistant", "content": said}, _user("poisoned: more")])
    await driver.close(sid)

    # Rows as the gateway stored an empty output before it was an error: OK, no output ids.
    check = vars(OutputCheck)["_some"]  # the staticmethod itself, to put back as it was
    OutputCheck._some = staticmethod(lambda result: None)  # type: ignore[method-assign]
    try:
        await conversation("legacy-empty-first", ["empty", "ok", "ok"])
        await conversation("legacy-empty-last", ["ok", "empty"])
    finally:
        OutputCheck._some = check  # type: ignore[method-assign]

    await conversation("unacknowledged", ["ok", "ok"])
    await conversation("interrupted", ["ok", "ok", "ok"])
    await conversation("no-captures", [])
    await conversation("still-open", ["ok", "empty"], close=False)
    await conversation("rollout-error", ["ok", "server_error"])


def _mark(store: FaultStore) -> None:
    """What the acknowledgement and relaunch paths write, and one rollout that ended in ERROR."""
    with session_scope(store.factory) as db:
        ids = {name: list(db.scalars(_seqs(sid))) for name, sid in store.sessions.items()}
        db.execute(sa.update(Capture).where(Capture.id == ids["unacknowledged"][-1]).values(status="UNACKNOWLEDGED"))
        db.execute(
            sa.update(Capture)
            .where(Capture.id.in_(ids["interrupted"][:2]))
            .values(status=CaptureStatus.INTERRUPTED, error="launch 1 was cut short")
        )
        db.execute(
            sa.update(Rollout).where(Rollout.id == store.sessions["rollout-error"]).values(status=RolloutStatus.ERROR)
        )


def _seqs(session_id: str) -> sa.Select[tuple[int]]:
    return sa.select(Capture.id).where(Capture.rollout_id == session_id).order_by(Capture.seq)


@contextmanager
def fault_store(tmp: Path, cache: Path, database_url: str | None = None) -> Iterator[FaultStore]:
    """Build the store (SQLite in ``tmp`` unless ``database_url``) and yield it."""
    settings = settings_for(tmp, cache, database_url, backend_deadline_s=DEADLINE_S)
    engine = make_engine(settings.resolved_database_url)
    store = FaultStore(settings, settings.resolved_database_url, make_session_factory(engine))
    app = fake_sglang()
    with ServerThread(app) as server:

        async def main() -> None:
            backend = SGLangBackend(server.url, model_info=INFO, timeout_s=30.0)
            try:
                async with asgi_gateway(settings, backend) as (_gw, client):
                    await _drive(_Driver(client, app), store)
            finally:
                await backend.aclose()

        asyncio.run(main())
    try:
        _mark(store)
        yield store
    finally:
        engine.dispose()
