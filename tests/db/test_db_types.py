"""The portable column types return the same Python values on SQLite and Postgres."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from db.engine import make_engine
from db.types import (
    FloatArray,
    IntArray,
    JSONType,
    UTCDateTime,
    decode_int32,
    decode_nul,
    encode_float32,
    encode_int32,
    encode_nul,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]

_metadata = sa.MetaData()
samples = sa.Table(
    "type_samples",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ints", IntArray()),
    sa.Column("floats", FloatArray()),
    sa.Column("doc", JSONType()),
    sa.Column("at", UTCDateTime()),
)


def float32(values: list[float]) -> list[float]:
    """The reference rounding, independent of db.types."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


@pytest.fixture
def samples_engine(database_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(database_url)
    _metadata.create_all(engine)
    yield engine
    _metadata.drop_all(engine)
    engine.dispose()


def _round_trip(engine: sa.Engine, **values: object) -> sa.Row:
    with engine.begin() as connection:
        row_id = connection.execute(samples.insert().values(**values).returning(samples.c.id)).scalar_one()
    with engine.connect() as connection:
        return connection.execute(sa.select(samples).where(samples.c.id == row_id)).one()


# §1 Both databases


def test_arrays_round_trip_exactly(samples_engine: sa.Engine) -> None:
    ints = [0, 1, -1, 151_643, INT32_MIN, INT32_MAX]
    floats = [0.0, -0.1, -2.5, 1e-3, -1e-45, 3.3e38, -math.inf, -123.456789]

    row = _round_trip(samples_engine, ints=ints, floats=floats)

    assert row.ints == ints
    assert row.floats == float32(floats)
    assert row.floats[1] != -0.1  # really float32, not the double it was given


def test_empty_and_null_arrays_stay_distinct(samples_engine: sa.Engine) -> None:
    assert _round_trip(samples_engine, ints=[], floats=[]).ints == []
    row = _round_trip(samples_engine, ints=None, floats=None)
    assert (row.ints, row.floats) == (None, None)


@pytest.mark.parametrize(
    ("column", "value"),
    [("ints", [INT32_MAX + 1]), ("ints", [INT32_MIN - 1]), ("floats", [FLOAT32_MAX * 2])],
    ids=["int-above", "int-below", "float-overflow"],
)
def test_values_outside_32_bits_are_rejected(samples_engine: sa.Engine, column: str, value: list[float]) -> None:
    with pytest.raises(sa.exc.StatementError) as caught:
        _round_trip(samples_engine, **{column: value})
    assert isinstance(caught.value.orig, OverflowError | struct.error)


def test_json_none_is_sql_null_and_documents_round_trip(samples_engine: sa.Engine) -> None:
    document = {"messages": [{"role": "user", "content": "héllo ✓"}], "n": 2, "ok": True, "none": None}
    assert _round_trip(samples_engine, doc=document).doc == document
    assert _round_trip(samples_engine, doc=[1, "two", None]).doc == [1, "two", None]

    _round_trip(samples_engine, doc=None)
    with samples_engine.connect() as connection:
        nulls = connection.execute(sa.select(sa.func.count()).where(samples.c.doc.is_(None))).scalar_one()
    assert nulls == 1


def test_json_holds_nul_exactly(samples_engine: sa.Engine) -> None:
    # JSONB cannot hold NUL; harnesses send it (binary tool output). It comes back exactly, keys and the escape
    # character itself included.
    document = {"a\u0000b": ["\u0000", "x\u0000y\u2400z", "\u24000", "\u2400\u2400", "plain"], "n": [1, None, True]}
    assert _round_trip(samples_engine, doc=document).doc == document
    assert _round_trip(samples_engine, doc="\u0000").doc == "\u0000"


@given(st.text(alphabet=st.sampled_from(["\u0000", "\u2400", "0", "a", "é"]), max_size=12))
def test_nul_encoding_is_reversible(text: str) -> None:
    encoded = encode_nul(text)
    assert "\u0000" not in encoded and decode_nul(encoded) == text


def test_datetimes_come_back_aware_in_utc(samples_engine: sa.Engine) -> None:
    local = datetime(2026, 3, 1, 12, 30, 15, 250_000, tzinfo=timezone(timedelta(hours=2)))

    row = _round_trip(samples_engine, at=local)

    assert row.at == local
    assert row.at.tzinfo == UTC
    assert row.at.hour == 10


def test_naive_datetimes_are_rejected(samples_engine: sa.Engine) -> None:
    with pytest.raises(sa.exc.StatementError, match="naive datetime"):
        _round_trip(samples_engine, at=datetime(2026, 3, 1, 12, 30))


# §2 SQLite encoding, property-based


@pytest.fixture(scope="module")
def sqlite_samples() -> Iterator[sa.Engine]:
    engine = make_engine("sqlite://")
    _metadata.create_all(engine)
    yield engine
    engine.dispose()


int32s = st.lists(st.integers(min_value=INT32_MIN, max_value=INT32_MAX), max_size=200)
float32s = st.lists(st.floats(width=32, allow_nan=False), max_size=200)


@settings(max_examples=50, deadline=None)
@given(ints=int32s, floats=float32s)
def test_random_arrays_round_trip_on_sqlite(sqlite_samples: sa.Engine, ints: list[int], floats: list[float]) -> None:
    row = _round_trip(sqlite_samples, ints=ints, floats=floats)
    assert row.ints == ints
    assert row.floats == float32(floats)


@settings(max_examples=50, deadline=None)
@given(floats=st.lists(st.floats(min_value=-FLOAT32_MAX, max_value=FLOAT32_MAX), max_size=50))
def test_any_double_in_range_is_stored_as_its_float32(floats: list[float]) -> None:
    # Doubles in float32 range (not just float32 values) are rounded, never rejected.
    assert list(struct.unpack(f"<{len(floats)}f", encode_float32(floats))) == float32(floats)


def test_encoding_is_little_endian_int32() -> None:
    assert encode_int32([1, -2]) == b"\x01\x00\x00\x00\xfe\xff\xff\xff"
    assert decode_int32(b"\x01\x00\x00\x00\xfe\xff\xff\xff") == [1, -2]
    assert encode_float32([1.0]) == b"\x00\x00\x80\x3f"
