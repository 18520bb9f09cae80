"""Portable column types: one Python value, the best native storage on each database.

- ``IntArray``: ``list[int]`` stored as ``int4[]`` on Postgres and as little-endian int32 bytes on SQLite.
- ``FloatArray``: ``list[float]`` stored as ``float4[]`` on Postgres and as little-endian float32 bytes on SQLite.
  Values are rounded to float32 before they are written and the exact float32 values are returned, so both
  databases hand back identical floats.
- ``JSONType``: JSON, as ``JSONB`` on Postgres. Python ``None`` is SQL NULL, never the JSON literal ``null``.
- ``UTCDateTime``: timezone-aware datetimes in, UTC-aware datetimes out, on both databases.

Token arrays hold int32 ids and float32 logprobs; a value outside those ranges is rejected when the row is
written (``OverflowError`` or ``struct.error`` inside SQLAlchemy's ``StatementError``), identically on both
databases, instead of being silently wrapped or turned into infinity.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Integer, LargeBinary
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REAL
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

_BIG_ENDIAN_HOST = sys.byteorder == "big"


def encode_int32(values: Iterable[int]) -> bytes:
    """Little-endian int32 bytes; raises ``OverflowError`` for a value outside the int32 range."""
    packed = array("i", values)
    if _BIG_ENDIAN_HOST:
        packed.byteswap()
    return packed.tobytes()


def decode_int32(data: bytes) -> list[int]:
    unpacked = array("i")
    unpacked.frombytes(data)
    if _BIG_ENDIAN_HOST:
        unpacked.byteswap()
    return unpacked.tolist()


def encode_float32(values: Iterable[float]) -> bytes:
    """Little-endian float32 bytes; raises ``OverflowError`` for a finite value beyond the float32 range.

    ``struct`` rather than ``array('f')``: the latter silently turns 1e300 into infinity, while Postgres rejects
    it, and the two stores must agree on what is accepted.
    """
    items = tuple(values)
    return struct.pack(f"<{len(items)}f", *items)


def decode_float32(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def round_float32(values: Iterable[float]) -> list[float]:
    """The float32 value of each item, as Python floats (what ``FloatArray`` returns after a round trip)."""
    return decode_float32(encode_float32(values))


class IntArray(TypeDecorator[list[int]]):
    """``list[int]`` of int32 values: ``int4[]`` on Postgres, little-endian int32 bytes on SQLite."""

    impl = LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(ARRAY(Integer))
        return dialect.type_descriptor(LargeBinary())

    def process_bind_param(self, value: Iterable[int] | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "postgresql":
            # Going through array('i') checks the range and the type on both databases alike, and turns tuples
            # or numpy integers into the plain list psycopg adapts.
            return array("i", value).tolist()
        return encode_int32(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> list[int] | None:
        if value is None:
            return None
        if dialect.name == "postgresql":
            return list(value)
        return decode_int32(value)


class FloatArray(TypeDecorator[list[float]]):
    """``list[float]`` of float32 values: ``float4[]`` on Postgres, little-endian float32 bytes on SQLite."""

    impl = LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(ARRAY(REAL))
        return dialect.type_descriptor(LargeBinary())

    def process_bind_param(self, value: Iterable[float] | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "postgresql":
            # Rounding here (not in the server's float8 -> float4 cast) gives Postgres exactly the values SQLite
            # stores, and turns a float32 underflow into 0.0 instead of Postgres's "value out of range" error.
            return round_float32(value)
        return encode_float32(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> list[float] | None:
        if value is None:
            return None
        if dialect.name == "postgresql":
            # psycopg parses float4 from its shortest decimal text ("0.1"), which is not the float32 value as a
            # double (0.10000000149011612); round again so both databases return the same floats.
            return round_float32(value)
        return decode_float32(value)


class JSONType(TypeDecorator[Any]):
    """JSON (``JSONB`` on Postgres). Python ``None`` is stored as SQL NULL, so ``IS NULL`` finds it."""

    impl = JSON
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(none_as_null=True)

    def __repr__(self) -> str:
        # Autogenerate renders types by repr; the default one would list impl arguments __init__ does not take.
        return "JSONType()"

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB(none_as_null=True))
        return dialect.type_descriptor(JSON(none_as_null=True))


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime, returned in UTC on both databases.

    Naive datetimes are rejected: their zone is a guess. SQLite has no zone support, so values are stored there
    as naive UTC (``CURRENT_TIMESTAMP`` is UTC too) and marked UTC again when read.
    """

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def __repr__(self) -> str:
        return "UTCDateTime()"

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()}: pass a timezone-aware value")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
