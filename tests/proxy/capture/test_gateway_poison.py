"""One bad row fails only itself: a poisoning session never fails another session's captures.

- The poison test: one session sends NUL text (stored faithfully, also in Postgres's JSONB, which cannot hold NUL),
  NaN, ``1e400`` and lone surrogates (400s naming the field) while eight other sessions make calls: all of theirs
  succeed, with their captures.
- The writer's group commit with one row that cannot be encoded and one the database refuses: the other rows
  commit, each bad one's caller gets the reason.
- A capture holding a NaN logprob (stored before output checks existed) does not break its session's listing.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from db import Capture, session_scope
from db.enums import CaptureStatus
from polar.backends.local import LocalBackend
from polar.errors import StoreError
from polar.proxy.capture.pending import Stored
from tests.pg import STORES, migrated_store
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for
from tests.proxy.shapes import PROTOCOLS, error_problem

CALLS_EACH = 6
NUL_TEXT = "binary\u0000output\u0000\u2400 end"


def _poison_bodies() -> list[tuple[bytes, int]]:
    chat = PROTOCOLS["openai_chat"]
    nul = json.dumps(chat.body(NUL_TEXT)).encode()
    base = json.dumps(chat.body("__x__"))
    return [
        (nul, 200),
        (base.replace('"__x__"', "NaN").encode(), 400),
        (base.replace('"max_tokens": 2', '"max_tokens": 2, "temperature": 1e400').encode(), 400),
        (base.replace('"__x__"', '"\\ud800"').encode(), 400),
        (nul, 200),
        (base.replace('"max_tokens": 2', '"max_tokens": 2, "top_p": NaN').encode(), 400),
    ]


async def _normal(client, index: int) -> list[str]:
    protocol = list(PROTOCOLS.values())[index % len(PROTOCOLS)]
    session = await open_session(client)
    failures = []
    for call in range(CALLS_EACH):
        reply = await client.post(
            protocol.url(False),
            json=protocol.body(f"session {index} call {call}"),
            headers=protocol.headers(session["api_key"]),
        )
        if reply.status_code != 200:
            failures.append(f"{protocol.name} #{index}.{call}: {reply.status_code} {reply.text[:200]}")
    rows = await captures(client, session["session_id"])
    if [r["status"] for r in rows] != ["OK"] * CALLS_EACH:
        failures.append(f"session {index}: captures {[r['status'] for r in rows]}")
    return failures


async def _poison(client) -> dict:
    session = await open_session(client)
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    for _round in range(2):
        for raw, status in _poison_bodies():
            reply = await client.post("/v1/chat/completions", content=raw, headers=headers)
            assert reply.status_code == status, reply.text
            if status != 200:
                assert error_problem("openai_chat", status, reply.json()) is None
    return session


async def _scenario(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (_gw, client):
        results = await asyncio.gather(_poison(client), *(_normal(client, i) for i in range(8)))
        failures = [f for result in results[1:] for f in result]
        assert failures == [], failures
        poison = results[0]
        rows = await captures(client, poison["session_id"], requests=True)
        assert [r["status"] for r in rows] == ["OK"] * 4  # the NUL calls; the refused ones never reached the store
        texts = [m["content"] for r in rows for m in r["request"]["messages"]]
        assert texts and all(text == NUL_TEXT for text in texts)  # exactly as sent


@pytest.mark.parametrize("store", STORES)
def test_a_poisoning_session_never_fails_the_others(store, tmp_path, cache_dir, engine):
    with migrated_store(store, tmp_path) as url:
        asyncio.run(_scenario(settings_for(tmp_path, cache_dir, database_url=url, default_max_tokens=2), engine))


def _row(session_id: str, output_ids: list[int]) -> Capture:
    return Capture(
        rollout_id=session_id,
        seq=-1,
        protocol="openai_chat",
        model="tiny",
        request_json={"messages": [{"role": "user", "content": "x\u0000y"}]},
        prompt_delta_ids=[1, 2],
        output_ids=output_ids,
        output_logprobs=[-0.5] * len(output_ids),
        render_mode="append",
        backend="local",
        n_prompt=2,
        n_prompt_delta=2,
        n_output=len(output_ids),
    )


async def _group_commit(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        sessions = [(await open_session(client))["session_id"] for _ in range(9)]
        writer = gw.writer
        writer.close()  # stop the thread, so that every row below lands in one batch
        rows = [_row(sid, [5, 6]) for sid in sessions[:8]] + [_row(sessions[8], [5, 2**40])]  # beyond int32
        rows.append(_row("no-such-session", [5, 6]))  # refused by the database itself (its foreign key)
        loop = asyncio.get_running_loop()
        futures = []
        for row in rows:
            future = loop.create_future()
            writer._queue.put(_pending(row, loop, future))
            futures.append(future)
        commits = writer.commits
        writer._ensure_started()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(o, Stored) and o.seq == 0 for o in outcomes[:8]), outcomes
        assert isinstance(outcomes[8], StoreError)
        assert sessions[8] in outcomes[8].message, outcomes[8].message  # refused when encoded, alone
        assert isinstance(outcomes[9], StoreError)
        assert "no-such-session" in outcomes[9].message, outcomes[9].message
        assert writer.commits > commits + 1  # the batch failed in the database, then its halves committed apart
        with session_scope(gw.factory) as db:
            stored = db.scalars(sa.select(Capture).where(Capture.id.in_([o.id for o in outcomes[:8]]))).all()
            assert sorted(c.rollout_id for c in stored) == sorted(sessions[:8])
            assert all(c.request_json["messages"][0]["content"] == "x\u0000y" for c in stored)


def _pending(row, loop, future):
    from polar.proxy.capture.pending import Pending  # white-box: rows put on the writer's queue directly

    return Pending(row, loop, future)


@pytest.mark.parametrize("store", STORES)
def test_a_bad_row_in_a_group_commit_fails_only_itself(store, tmp_path, cache_dir, engine):
    with migrated_store(store, tmp_path) as url:
        asyncio.run(_group_commit(settings_for(tmp_path, cache_dir, database_url=url), engine))


async def _nan_listing(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client)
        with session_scope(gw.factory) as db:
            row = _row(session["session_id"], [5, 6])
            row.seq, row.output_logprobs, row.status = 0, [float("nan"), -0.5], CaptureStatus.OK
            db.add(row)
        rows = await captures(client, session["session_id"], requests=True)
        assert rows[0]["output_logprobs"] == [None, -0.5]


@pytest.mark.parametrize("store", STORES)
def test_a_nan_logprob_in_the_store_does_not_break_the_listing(store, tmp_path, cache_dir, engine):
    with migrated_store(store, tmp_path) as url:
        asyncio.run(_nan_listing(settings_for(tmp_path, cache_dir, database_url=url), engine))
