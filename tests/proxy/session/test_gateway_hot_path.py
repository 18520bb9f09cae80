"""The gateway's hot path against the store, on SQLite and Postgres: in the steady state a call reads nothing
and writes once; several gateways (replicas) on one store keep a session's seq dense and its history whole;
a session closed elsewhere gets no reply acknowledged even while its key is still cached; a cached key past its
TTL is rechecked in the background (calls never wait on it), in one read for many keys; a session opened again
with a new key (a relaunched harness) starts a new history on every replica."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from polar.backends.local import LocalBackend
from polar.proxy.gateway import Gateway
from polar.proxy.session.sessions import SessionStore
from tests.pg import STORES, migrated_store
from tests.proxy.asgi_gateway import asgi_gateway, captures, open_session
from tests.proxy.gateway_server import settings_for

N_REPLIES = 8
SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i}"} for i in range(N_REPLIES)]}
TOOLS = [{"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}}]


@pytest.fixture(params=STORES)
def store_url(request, tmp_path) -> Iterator[str]:
    with migrated_store(request.param, tmp_path) as url:
        yield url


@contextmanager
def statements(gw: Gateway) -> Iterator[list[str]]:
    """The first two words of every SQL statement the gateway's engine runs inside the block (the writer thread's
    included). On Postgres the captures are inserted by a ``COPY`` on the raw driver, which SQLAlchemy does not
    see: its ids are drawn first (``SELECT nextval(...)``), and that statement stands for the insert here."""
    seen: list[str] = []
    engine = gw.factory.kw["bind"]

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(" ".join(statement.split()[:2]).upper())

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


async def _call(client, key: str, messages: list) -> str:
    reply = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_steady_state_calls_read_nothing_and_write_once(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_steady_state(settings_for(tmp_path, cache_dir, store_url, session_cache_ttl_s=60), engine))


async def _steady_state(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        for turn in range(N_REPLIES):
            loads = gw.histories.loads
            with statements(gw) as seen:
                content = await _call(client, session["api_key"], messages)
            assert content == f"reply {turn}"
            # The first call too: the key and the (empty) history of a session opened here are known.
            assert gw.histories.loads == loads
            inserts = [s for s in seen if s.startswith(("INSERT", "SELECT NEXTVAL("))]
            assert not [s for s in seen if s.startswith("SELECT") and s not in inserts], seen
            assert len(inserts) == 1 and len(seen) == 2 and seen[0].startswith("UPDATE"), seen
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        rows = await captures(client, session["session_id"])
        assert [c["seq"] for c in rows] == list(range(N_REPLIES))
        for parent, child in itertools.pairwise(rows):
            assert child["parent_id"] == parent["id"] and child["render_mode"] == "append"


def test_replicas_share_a_session_turn_by_turn(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_alternating(settings_for(tmp_path, cache_dir, store_url), engine))


async def _alternating(settings, engine) -> None:
    async with (
        asgi_gateway(settings, LocalBackend(engine)) as (gw_a, a),
        asgi_gateway(settings, LocalBackend(engine)) as (gw_b, b),
    ):
        session = await open_session(a, policy=SCRIPT)
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        # Two turns on A, then alternating: each replica must notice the other's calls it never saw.
        for turn, client in enumerate([a, a, b, a, b, b, a, b]):
            content = await _call(client, session["api_key"], messages)
            assert content == f"reply {turn}"  # the scripted cursor counts every earlier call, from both
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        rows = await captures(b, session["session_id"])
        assert [c["seq"] for c in rows] == list(range(N_REPLIES))
        for parent, child in itertools.pairwise(rows):
            assert child["parent_id"] == parent["id"] and child["render_mode"] == "append", child
        assert gw_a.histories.loads >= 2 and gw_b.histories.loads >= 2


def test_a_session_opened_again_with_a_new_key_starts_a_new_history_on_every_replica(
    store_url, tmp_path, cache_dir, engine
):
    asyncio.run(_relaunched(settings_for(tmp_path, cache_dir, store_url, session_cache_ttl_s=60), engine))


async def _relaunched(settings, engine) -> None:
    from db import Capture, session_scope
    from db.enums import CaptureStatus

    async with (
        asgi_gateway(settings, LocalBackend(engine)) as (gw, a),
        asgi_gateway(settings, LocalBackend(engine)) as (_, b),
    ):
        session = await open_session(a, policy=SCRIPT)
        sid, first = session["session_id"], [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        messages = list(first)
        for turn, client in enumerate([a, b, a]):  # both replicas hold the first launch's calls in memory
            content = await _call(client, session["api_key"], messages)
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        # What the run stage does elsewhere before launching the harness again: close the session, set the old
        # launch's captures aside, open the session with a new key (no replica is told but through the store).
        store = SessionStore(gw.factory)
        store.close(sid)
        with session_scope(gw.factory) as db:
            db.execute(sa.update(Capture).where(Capture.rollout_id == sid).values(status=CaptureStatus.INTERRUPTED))
        _, key = store.create(rollout_id=sid, replace_key=True, policy=SCRIPT)
        messages = list(first)
        for turn, client in enumerate([b, a, b]):
            content = await _call(client, key, messages)
            assert content == f"reply {turn}"  # the script starts again: the old launch's calls are not counted
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        rows = await captures(a, sid)
        assert [c["seq"] for c in rows] == list(range(6))
        old, new = rows[:3], rows[3:]
        assert all(c["status"] == "INTERRUPTED" for c in old) and all(c["status"] == "OK" for c in new)
        assert new[0]["parent_id"] is None  # never extends a call of the old launch
        assert [c["parent_id"] for c in new[1:]] == [new[0]["id"], new[1]["id"]]


def test_concurrent_replicas_get_dense_unique_seqs(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_concurrent(settings_for(tmp_path, cache_dir, store_url), engine))


async def _concurrent(settings, engine) -> None:
    async with (
        asgi_gateway(settings, LocalBackend(engine)) as (_, a),
        asgi_gateway(settings, LocalBackend(engine)) as (_, b),
    ):
        session = await open_session(a, policy=SCRIPT)
        root = [{"role": "user", "content": "go"}]
        calls = [_call(client, session["api_key"], root) for client in [a, b] * 12]
        await asyncio.gather(*calls)
        rows = await captures(a, session["session_id"])
        assert sorted(c["seq"] for c in rows) == list(range(24))


def test_a_session_closed_elsewhere_gets_no_reply_from_a_cached_key(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_revoked(settings_for(tmp_path, cache_dir, store_url, session_cache_ttl_s=600), engine))


async def _revoked(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        session = await open_session(client, policy=SCRIPT)
        messages = [{"role": "user", "content": "go"}]
        await _call(client, session["api_key"], messages)
        assert gw.sessions.cached(session["api_key"]) is not None
        # Closed by another process (a replica, the control API, a flow's takeover): this one still trusts the key.
        SessionStore(gw.factory).close(session["session_id"])
        assert gw.sessions.cached(session["api_key"]) is not None
        reply = await client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 4},
            headers={"Authorization": f"Bearer {session['api_key']}"},
        )
        assert reply.status_code == 403, reply.text
        assert "closed" in reply.json()["error"]["message"]
        assert len(await captures(client, session["session_id"])) == 1  # nothing committed after the close


def test_stale_keys_are_rechecked_in_one_read(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_rechecked_in_one_read(settings_for(tmp_path, cache_dir, store_url), engine))


async def _rechecked_in_one_read(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, _):
        queued: list[bool] = []
        store = SessionStore(gw.factory, ttl_s=0.01, on_stale=lambda: queued.append(True))
        keys = [store.create()[1] for _ in range(4)]  # opened here: cached from the start
        infos = [store.cached(key) for key in keys]
        elsewhere = SessionStore(gw.factory)
        elsewhere.create(rollout_id=infos[1].id, replace_key=True)
        elsewhere.close(infos[2].id)
        time.sleep(0.02)
        assert [store.cached(key) for key in keys] == infos and len(queued) == 4  # stale, still trusted, queued
        assert [store.cached(key) for key in keys] == infos and len(queued) == 4  # queued once
        with statements(gw) as seen:
            assert store.recheck() == 4
        assert seen == ["SELECT ROLLOUTS.ID,"], seen
        assert store.cached(keys[0]) == infos[0] and store.cached(keys[3]) == infos[3]  # renewed, not queued again
        assert store.cached(keys[1]) is None and store.cached(keys[2]) is None  # re-keyed, closed: dropped
        assert len(queued) == 4 and store.recheck() == 0


def test_a_call_with_a_stale_key_does_not_wait_for_its_recheck(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_not_waiting(settings_for(tmp_path, cache_dir, store_url, session_cache_ttl_s=0.05), engine))


async def _not_waiting(settings, engine) -> None:
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        kept, closed = await open_session(client, policy=SCRIPT), await open_session(client, policy=SCRIPT)
        messages = [{"role": "user", "content": "go"}]
        recheck, release = gw.sessions.recheck, threading.Event()

        def held_recheck() -> int:
            release.wait(30)
            return recheck()

        gw.sessions.recheck = held_recheck  # type: ignore[method-assign]
        SessionStore(gw.factory).close(closed["session_id"])
        await asyncio.sleep(0.1)
        assert await _call(client, kept["api_key"], messages) == "reply 0"  # its recheck is held: not waited on
        refused = await client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 4},
            headers={"Authorization": f"Bearer {closed['api_key']}"},
        )
        assert refused.status_code == 403, refused.text  # still trusted here, but refused at commit
        release.set()
        assert gw._rechecking is not None
        await gw._rechecking
        assert gw.sessions.cached(closed["api_key"]) is None  # the recheck dropped it
        assert gw.sessions.cached(kept["api_key"]) is not None
        assert await _call(client, kept["api_key"], messages + [{"role": "user", "content": "again"}]) == "reply 1"
        refused = await client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 4},
            headers={"Authorization": f"Bearer {closed['api_key']}"},
        )
        assert refused.status_code == 403 and "closed" in refused.json()["error"]["message"]


def test_one_group_commit_checks_each_call_against_its_own_key(store_url, tmp_path, cache_dir, engine):
    asyncio.run(_keys_in_one_batch(settings_for(tmp_path, cache_dir, store_url), engine))


async def _keys_in_one_batch(settings, engine) -> None:
    from db import Capture, session_scope
    from polar.errors import PermissionDenied
    from polar.proxy.capture.pending import Pending, Stored  # white-box: rows put on the writer's queue at once
    from polar.proxy.session.sessions import hash_key
    from tests.proxy.capture.test_gateway_poison import _row

    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        a, b, c = [await open_session(client) for _ in range(3)]
        await gw.in_store(SessionStore(gw.factory).close, c["session_id"])
        current, stale = hash_key(a["api_key"]), hash_key("sk-polar-an-old-key")
        batch = [
            (a, current),
            (a, stale),  # the same rollout under a key it no longer has: its own UPDATE, refused
            (b, hash_key(b["api_key"])),
            (c, hash_key(c["api_key"])),  # closed
            (b, None),  # unchecked
            (a, current),
        ]
        gw.writer.close()  # stop the thread, so that every row lands in one batch
        loop = asyncio.get_running_loop()
        futures = []
        for session, key_hash in batch:
            future = loop.create_future()
            gw.writer._queue.put(Pending(_row(session["session_id"], [5, 6]), loop, future, key_hash))
            futures.append(future)
        gw.writer._ensure_started()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        kinds = [type(o).__name__ for o in outcomes]
        assert kinds == ["Stored", "PermissionDenied", "Stored", "PermissionDenied", "Stored", "Stored"], outcomes
        assert isinstance(outcomes[1], PermissionDenied) and isinstance(outcomes[0], Stored)
        assert [outcomes[0].seq, outcomes[5].seq] == [0, 1] and sorted([outcomes[2].seq, outcomes[4].seq]) == [0, 1]
        with session_scope(gw.factory) as db:
            assert db.scalar(sa.select(sa.func.count()).select_from(Capture)) == 4
