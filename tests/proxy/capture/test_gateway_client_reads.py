"""Acknowledged means the client read it, streamed or not, over real sockets with the official SDKs.

- A hedged final call (sent twice; the client keeps the first answer and drops the other connection): the dropped
  reply is ``UNACKNOWLEDGED`` and the build trains the reply the client got, not the one committed last.
- A client read timeout on a non-streamed call, with or without keep-alive padding: ``UNACKNOWLEDGED``.
- A stream cut mid-generation: a row with its prompt and the ids sampled so far (``UNACKNOWLEDGED``, finish
  reason ``abort``, the cause in ``error``), never nothing.
- The next call after a cut first call, keeping the partial text: a root with cause ``reply_cut`` (the model's
  text, not the client's); the partial reply is never trained, the new reply is. After a later turn is cut, the
  same text makes the next call a ``match`` with that cause: the chain around the cut trains on.

Each build asserts which sampled tokens train (``loss_tokens``, the traces' masked ids) and why the others do not
(``merge_stats.untrained_tokens``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import anthropic
import httpx
import openai
import pytest
import sqlalchemy as sa

from db import Capture, session_scope
from polar.backends.local import LocalBackend
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import CaptureRecord
from tests.proxy.gateway_server import GatewayServer, settings_for

HI = [{"role": "user", "content": "hi"}]


class PacedBackend(LocalBackend):
    """The local engine, each generation held ``delays.pop(0)`` seconds first (none queued: at once); with
    ``drip_s`` set, one token every ``drip_s`` seconds and never its end of sequence (a long generation)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.delays: list[float] = []
        self.drip_s = 0.0

    async def stream(self, request):
        await asyncio.sleep(self.delays.pop(0) if self.delays else 0.0)
        drip = self.drip_s
        if drip:
            sampling = request.sampling.model_copy(update={"ignore_eos": True, "stop_token_ids": ()})
            request = dataclasses.replace(request, sampling=sampling)
        async for chunk in super().stream(request):
            if drip:
                await asyncio.sleep(drip)
            yield chunk


@pytest.fixture(scope="module")
def paced(engine):
    return PacedBackend(engine)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, cache_dir, paced):
    with GatewayServer(settings_for(tmp_path_factory.mktemp("reads"), cache_dir), backend=paced) as server:
        yield server


@pytest.fixture(scope="module")
def padded_gateway(tmp_path_factory, cache_dir, paced):
    settings = settings_for(tmp_path_factory.mktemp("padded"), cache_dir, keepalive_s=0.1)
    with GatewayServer(settings, backend=paced) as server:
        yield server


@pytest.fixture(autouse=True)
def _calm(paced):
    paced.delays, paced.drip_s = [], 0.0
    yield
    paced.delays, paced.drip_s = [], 0.0


def _records(gateway: GatewayServer, session_id: str) -> list[CaptureRecord]:
    with session_scope(gateway.gateway.factory) as db:
        rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id)).all()
        return sorted((CaptureRecord.from_row(r) for r in rows), key=lambda r: r.seq)


def _rows(gateway: GatewayServer, session_id: str) -> list[Capture]:
    with session_scope(gateway.gateway.factory) as db:
        rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)).all()
        db.expunge_all()
        return list(rows)


def _until(gateway: GatewayServer, session_id: str, done: Callable[[list[CaptureRecord]], bool]) -> list:
    """The session's records once ``done`` holds (a bound for the test, not a timing assertion)."""
    deadline = time.monotonic() + 15
    while True:
        records = _records(gateway, session_id)
        if done(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def _statuses(records: list[CaptureRecord]) -> list[str]:
    return [r.status.value for r in records]


def test_a_hedged_final_call_trains_the_reply_the_client_kept(gateway, paced):
    session = gateway.session()
    paced.delays = [1.5, 0.0]  # the first copy is slow, so the harness hedges; the second answers first

    async def hedge() -> str:
        client = openai.AsyncOpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
        slow = asyncio.create_task(client.chat.completions.create(model="tiny", max_tokens=8, messages=HI))
        await asyncio.sleep(0.5)  # the slow copy is in the backend: the hedge goes out
        fast = asyncio.create_task(client.chat.completions.create(model="tiny", max_tokens=8, messages=HI))
        kept = await fast
        slow.cancel()  # the harness keeps the first answer and drops the other connection
        await asyncio.gather(slow, return_exceptions=True)
        await client.close()
        return kept.id

    kept_id = asyncio.run(hedge())
    records = _until(gateway, session["session_id"], lambda rs: _statuses(rs) == ["OK", "UNACKNOWLEDGED"])
    rows = _rows(gateway, session["session_id"])
    assert [r.status.value for r in rows] == ["OK", "UNACKNOWLEDGED"]
    kept, dropped = records
    assert rows[0].response_json["id"] == kept_id  # the one the client got committed first, the dropped one last
    stats = prefix_merge(records).stats
    # Before: both OK, the latest (the dropped one) trained and the client's reply a dead branch.
    assert stats.untrained_tokens == {"unacknowledged": len(dropped.output_ids)}
    assert stats.loss_tokens == len(kept.output_ids)
    (trace,) = prefix_merge(records).traces
    assert trace.capture_ids == (kept.id,)
    assert [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m] == list(kept.output_ids)


def test_a_client_read_timeout_leaves_its_reply_unacknowledged(gateway, paced):
    session = gateway.session()
    paced.delays = [1.0]
    client = openai.OpenAI(
        base_url=session["base_urls"]["openai"], api_key=session["api_key"], timeout=0.3, max_retries=0
    )
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="tiny", max_tokens=8, messages=HI)
    client.close()
    records = _until(gateway, session["session_id"], lambda rs: _statuses(rs) == ["UNACKNOWLEDGED"])
    assert _statuses(records) == ["UNACKNOWLEDGED"] and records[0].output_ids  # generated, committed, never read
    stats = prefix_merge(records).stats
    assert stats.loss_tokens == 0 and stats.untrained_tokens == {"unacknowledged": len(records[0].output_ids)}
    # The harness retries: the retry is the one trained, the lost reply is no one's parent.
    anthropic_client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    anthropic_client.messages.create(model="tiny", max_tokens=8, messages=HI)
    anthropic_client.close()
    records = _records(gateway, session["session_id"])
    assert _statuses(records) == ["UNACKNOWLEDGED", "OK"] and records[1].parent_id is None
    stats = prefix_merge(records).stats
    assert stats.loss_tokens == len(records[1].output_ids)
    assert stats.untrained_tokens == {"unacknowledged": len(records[0].output_ids)}


def test_a_client_that_leaves_a_padded_reply_leaves_it_unacknowledged(padded_gateway, paced):
    session = padded_gateway.session()
    paced.delays = [1.0]
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    body = {"model": "tiny", "max_tokens": 8, "messages": HI}
    with httpx.stream("POST", padded_gateway.url + "/v1/chat/completions", json=body, headers=headers) as reply:
        assert reply.status_code == 200
        assert next(reply.iter_raw()).startswith(b" ")  # keep-alive spaces: then the client gives up
    records = _until(padded_gateway, session["session_id"], lambda rs: _statuses(rs) == ["UNACKNOWLEDGED"])
    assert _statuses(records) == ["UNACKNOWLEDGED"]
    # One read to the end is delivered, padded or not.
    assert httpx.post(padded_gateway.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200
    assert _statuses(_records(padded_gateway, session["session_id"])) == ["UNACKNOWLEDGED", "OK"]


def _cut_stream(gateway: GatewayServer, session: dict, protocol: str) -> str:
    """A stream read for a few content deltas, then closed by the client; the text it got."""
    got = ""
    if protocol == "openai":
        client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
        stream = client.chat.completions.create(model="tiny", max_tokens=400, messages=HI, stream=True)
        for n, chunk in enumerate(stream):
            got += "".join(c.delta.content or "" for c in chunk.choices)
            if n >= 6:
                break
        stream.close()
    else:
        client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
        with client.messages.stream(model="tiny", max_tokens=400, messages=HI) as stream:
            for n, text in enumerate(stream.text_stream):
                got += text
                if n >= 6:
                    break
    client.close()
    return got


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_stream_cut_mid_generation_leaves_a_row_with_its_partial_ids(gateway, paced, protocol):
    session = gateway.session()
    paced.drip_s = 0.02  # 400 tokens would take 8 s: the client leaves long before
    got = _cut_stream(gateway, session, protocol)
    assert got
    records = _until(gateway, session["session_id"], lambda rs: _statuses(rs) == ["UNACKNOWLEDGED"])
    (cut,) = records
    (row,) = _rows(gateway, session["session_id"])
    assert row.status.value == "UNACKNOWLEDGED" and row.finish_reason == "abort"
    assert row.error is not None and row.error.startswith("client_left:")
    assert 0 < len(cut.output_ids) < 400 and len(cut.output_logprobs) == len(cut.output_ids)
    assert row.n_prompt > 0 and cut.prompt_delta_ids  # its prompt is on record
    stats = prefix_merge(records).stats
    assert stats.loss_tokens == 0 and stats.untrained_tokens == {"unacknowledged": len(cut.output_ids)}


def test_the_call_after_a_cut_first_call_keeps_the_partial_text_as_the_models_not_the_clients(gateway, paced):
    session = gateway.session()
    paced.drip_s = 0.02
    got = _cut_stream(gateway, session, "openai")
    _until(gateway, session["session_id"], lambda rs: _statuses(rs) == ["UNACKNOWLEDGED"])
    paced.drip_s = 0.0
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    kept = [*HI, {"role": "assistant", "content": got}, {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="tiny", max_tokens=8, messages=kept)
    client.close()
    rows = _rows(gateway, session["session_id"])
    assert [(r.status.value, r.admission, r.admission_cause) for r in rows] == [
        ("UNACKNOWLEDGED", "root", "first_call"),
        ("OK", "root", "reply_cut"),  # was ("root", "first_call"): the model's text taken for the client's
    ]
    cut, nxt = _records(gateway, session["session_id"])
    build = prefix_merge([cut, nxt])
    stats = build.stats
    # The new reply trains; the partial reply is never trained (not as a sampled reply, not as client text).
    assert stats.loss_tokens == len(nxt.output_ids)
    assert stats.untrained_tokens == {"unacknowledged": len(cut.output_ids)}
    assert stats.root_causes == {"reply_cut": 1}
    (trace,) = build.traces
    assert trace.capture_ids == (nxt.id,)
    assert [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m] == list(nxt.output_ids)


def test_a_cut_later_turn_kept_by_the_client_matches_its_chain_and_trains_around_it(gateway, paced):
    session = gateway.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    first = client.chat.completions.create(model="tiny", max_tokens=8, messages=HI).choices[0].message
    history = [*HI, {"role": "assistant", "content": first.content}, {"role": "user", "content": "more"}]
    paced.drip_s = 0.02
    stream = client.chat.completions.create(model="tiny", max_tokens=400, messages=history, stream=True)
    got = ""
    for n, chunk in enumerate(stream):
        got += "".join(c.delta.content or "" for c in chunk.choices)
        if n >= 6:
            break
    stream.close()
    _until(gateway, session["session_id"], lambda rs: _statuses(rs) == ["OK", "UNACKNOWLEDGED"])
    paced.drip_s = 0.0
    kept = [*history, {"role": "assistant", "content": got}, {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="tiny", max_tokens=8, messages=kept)
    client.close()
    rows = _rows(gateway, session["session_id"])
    assert [(r.status.value, r.admission, r.admission_cause) for r in rows] == [
        ("OK", "root", "first_call"),
        ("UNACKNOWLEDGED", "match", None),
        ("OK", "match", "reply_cut"),  # was ("unresolved", "history_edited"): the whole chain poisoned
    ]
    one, cut, three = _records(gateway, session["session_id"])
    assert three.parent_id == one.id
    build = prefix_merge([one, cut, three])
    # Both sampled replies around the cut train, in one chain; the cut reply's ids are context, never trained.
    assert build.stats.loss_tokens == len(one.output_ids) + len(three.output_ids)
    assert build.stats.untrained_tokens == {"unacknowledged": len(cut.output_ids)}
    (trace,) = build.traces
    assert trace.capture_ids == (one.id, three.id)
    trained = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
    assert trained == [*one.output_ids, *three.output_ids]
