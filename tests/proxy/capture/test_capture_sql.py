"""The capture writer's own encoding (``polar.proxy.capture.sql``) stores exactly what the ORM's column types do.

The writer skips the ORM (a binary ``COPY`` on Postgres, a multi-row insert on SQLite), so a row it commits is read
back here through the ORM and compared with the same values written through the ORM: edge values of every encoded
column (int32 extremes, empty arrays, float32 rounding, infinities and NaN, NUL and the NUL escape in JSON, integers
beyond 64 bits, SQL NULLs), and the values a column refuses fail only their own row.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import sqlalchemy as sa

from db import Capture, Rollout, session_scope
from db.enums import CaptureStatus
from polar.errors import StoreError
from polar.proxy.capture.writer import CaptureWriter
from tests.pg import STORES, migrated_factory

EDGE = {
    "prompt_delta_ids": [0, -1, 2**31 - 1, -(2**31), 7],
    "output_ids": [],
    "output_logprobs": [],
    "request_json": {"text": "a\u0000b \u2400 c", "big": 2**70, "nested": [{"k": None}], "tab": "x\ty\n\\"},
    "response_json": None,
    "matched_stop": 151645,
    "version_spans": [{"version": "v1", "start": 0, "end": 3}],
    "error": "tab\there\nnewline \\ backslash",
    "latency_s": 0.25,
}
FLOATS = [0.1, -1e-50, 3.4e38, -math.inf, math.inf, math.nan, -0.0]


def _capture(rollout_id: str, **values) -> Capture:
    fields = {
        "rollout_id": rollout_id,
        "seq": 0,
        "protocol": "openai_chat",
        "model": "tiny",
        "request_json": {"messages": []},
        "prompt_delta_ids": [1],
        "output_ids": [2],
        "output_logprobs": [-0.5],
        "render_mode": "append",
        "backend": "local",
        "n_prompt": 1,
        "n_prompt_delta": 1,
        "n_output": 1,
    }
    return Capture(**(fields | values))


def _columns(row: Capture) -> dict:
    skip = {"id", "rollout_id", "created_at"}
    out = {c.name: getattr(row, c.name) for c in Capture.__table__.columns if c.name not in skip}
    out["output_logprobs"] = [repr(v) for v in out["output_logprobs"]]  # NaN == NaN, -0.0 kept apart from 0.0
    return out


@pytest.fixture(params=STORES)
def factory(request, tmp_path):
    with migrated_factory(request.param, tmp_path) as made:
        yield made


async def _write(factory, rows: list[Capture]) -> list:
    writer = CaptureWriter(factory)
    try:
        return await asyncio.gather(*(writer.write(row, timeout_s=30) for row in rows), return_exceptions=True)
    finally:
        writer.close()


def test_the_writer_stores_what_the_orm_stores(factory):
    with session_scope(factory) as db:
        by_writer, by_orm = Rollout(), Rollout()
        db.add_all([by_writer, by_orm])
    values = [EDGE, EDGE | {"output_ids": [5] * len(FLOATS), "output_logprobs": FLOATS, "error": None}]
    outcomes = asyncio.run(_write(factory, [_capture(by_writer.id, **v) for v in values]))
    assert [type(o) for o in outcomes] == [int, int], outcomes
    with session_scope(factory) as db:
        for seq, v in enumerate(values):
            db.add(_capture(by_orm.id, **(v | {"seq": seq})))
    with session_scope(factory) as db:

        def read(rollout_id: str) -> list[dict]:
            rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout_id).order_by(Capture.seq))
            return [_columns(row) for row in rows]

        written = read(by_writer.id)
        assert written == read(by_orm.id)
    assert written[0]["request_json"]["text"] == "a\u0000b \u2400 c" and written[0]["status"] == CaptureStatus.OK
    assert written[1]["output_logprobs"][:2] == [repr(0.10000000149011612), "-0.0"]


def test_a_value_the_column_refuses_fails_only_its_row(factory):
    with session_scope(factory) as db:
        rollout = Rollout()
        db.add(rollout)
    rows = [
        _capture(rollout.id, output_ids=[2**31]),
        _capture(rollout.id, output_logprobs=[1e39]),
        _capture(rollout.id),
    ]
    outcomes = asyncio.run(_write(factory, rows))
    assert [type(o) for o in outcomes] == [StoreError, StoreError, int], outcomes
    with session_scope(factory) as db:
        assert db.scalars(sa.select(Capture.seq).where(Capture.rollout_id == rollout.id)).all() == [0]


def test_writing_a_capture_leaves_the_strings_of_its_reply_as_they_were(factory):
    """A capture's reply holds the strings the session keeps as the call's reply; orjson would keep each non-ASCII
    one's UTF-8 form inside it (``sys.getsizeof`` grows), doubling them in memory. The writer serialises copies of
    the reply's: the kept strings stay their size, and the row reads back equal. (A request's strings are not
    kept past its call: the session holds its messages sealed, so they are serialised as they are.)"""
    import sys

    import orjson

    text = "ok → café 🙂 " * 2000
    key = "ключ " * 10
    request = {"messages": [{"role": "tool", "content": "ok → " * 100}]}
    reply = {"t": text, key: [text, "ascii", 1.5, None]}
    size, key_size = sys.getsizeof(text), sys.getsizeof(key)
    with session_scope(factory) as db:
        rollout = Rollout()
        db.add(rollout)
    outcomes = asyncio.run(_write(factory, [_capture(rollout.id, request_json=request, response_json=reply)]))
    assert [type(o) for o in outcomes] == [int], outcomes
    assert (sys.getsizeof(text), sys.getsizeof(key)) == (size, key_size)
    with session_scope(factory) as db:
        stored = db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout.id)).one()
        assert stored.request_json == request and stored.response_json == reply
    orjson.dumps(text)
    assert sys.getsizeof(text) > size  # what the test guards against: orjson keeps the UTF-8 form inside
