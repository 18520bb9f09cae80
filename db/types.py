"""Portable column types: one Python value, the best native storage on each database.

- ``IntArray``: ``list[int]`` stored as ``int4[]`` on Postgres and as little-endian int32 bytes on SQLite.
- ``FloatArray``: ``list[float]`` stored as ``float4[]`` on Postgres and as little-endian float32 bytes on SQLite.
  Values are rounded to float32 before they are written and the exact float32 values are returned, so both
  databases hand back identical floats.
- ``JSONType``: JSON, as ``JSONB`` on Postgres. Python ``None`` is SQL NULL, never the JSON literal ``null``.
  JSONB cannot hold the NUL character (``\u0000``), which harnesses do send (binary tool output); on Postgres
  every string (keys too) is therefore stored with ``encode_nul`` (NUL as ``␀0``, a literal ``␀`` as ``␀␀``)
  and decoded on read, so what the harness sent comes back exactly. SQLite stores strings as they are.
- ``UTCDateTime``: timezone-aware datetimes in, UTC-aware datetimes out, on both databases.

Token arrays hold int32 ids and float32 logprobs; a value outside those ranges is rejected when the row is
written (``OverflowError`` or ``struct.error`` inside SQLAlchemy's ``StatementError``), identically on both
databases, instead of being silently wrapped or turned into infinity.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable
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


NUL_ESCAPE = "\u2400"  # SYMBOL FOR NULL: readable in SQL, and itself escaped, so the encoding is reversible
_NUL_CODES = {"0": "\x00", NUL_ESCAPE: NUL_ESCAPE}


def encode_nul(text: str) -> str:
    """``text`` without NUL: NUL becomes ``␀0`` and ``␀`` becomes ``␀␀`` (``decode_nul`` inverts it)."""
    return text.replace(NUL_ESCAPE, NUL_ESCAPE * 2).replace("\x00", NUL_ESCAPE + "0")


def decode_nul(text: str) -> str:
    if NUL_ESCAPE not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == NUL_ESCAPE and i + 1 < len(text) and text[i + 1] in _NUL_CODES:
            out.append(_NUL_CODES[text[i + 1]])
            i += 2
        else:  # not written by encode_nul (a row from before it): kept as it is
            out.append(char)
            i += 1
    return "".join(out)


def _map_strings(value: Any, convert: Callable[[str], str]) -> Any:
    """``value`` with ``convert`` applied to every string in it, keys too."""
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, dict):
        return {convert(k): _map_strings(v, convert) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, convert) for v in value]
    return value


def _holds(value: Any, needles: tuple[str, ...]) -> bool:
    """Whether any string in ``value`` holds one of ``needles`` (iterative: bodies can be large and deep)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if any(n in node for n in needles):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


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

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "postgresql" or value is None or not _holds(value, ("\x00", NUL_ESCAPE)):
            return value
        return _map_strings(value, encode_nul)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "postgresql" or value is None or not _holds(value, (NUL_ESCAPE,)):
            return value
        return _map_strings(value, decode_nul)


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
