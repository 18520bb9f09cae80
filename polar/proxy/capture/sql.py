"""The capture writer's SQL: rows encoded once, in plain Python, and written with one statement per step.

The group commit is the gateway's one database write per call, so it skips the ORM: a batch is one counter
``UPDATE ... RETURNING`` and one bulk insert on the raw driver (SQLite: a multi-row ``INSERT ... RETURNING``;
Postgres: ids drawn from the sequence, then one binary ``COPY``), with SQLAlchemy's error translation kept (an
unreachable store is still a ``StoreError``). Values are encoded here exactly as the column types of
``db.types`` encode them, so a row reads back the same either way:

- token arrays: little-endian int32 / float32 bytes, packed in C by ``db.types.encode_int32`` /
  ``encode_float32`` (an id outside int32 or a finite float beyond float32 raises, as the column types do);
  on Postgres those bytes are then laid out as a binary ``int4[]`` / ``float4[]``, never item by item in Python.
- JSON: serialised once by orjson (the standard encoder for what orjson refuses), NUL-encoded on Postgres
  (``db.types.JSONType``), sent as jsonb there.
- columns left unset get their model's default (``status`` OK, ``prefix_len`` 0, ...); ``created_at`` is the
  server's.

A value that cannot be encoded fails only its own row, before any statement runs.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import psycopg
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect

from db.enums import CaptureStatus
from db.models import Capture
from db.types import NUL_ESCAPE, JSONType, encode_float32, encode_int32

INT_ARRAYS = ("prompt_delta_ids", "output_ids")
FLOAT_ARRAYS = ("output_logprobs",)
JSON_COLUMNS = ("request_json", "response_json", "matched_stop", "version_spans", "sampling_params")
# Every column the writer sets: all but the id and the server's created_at.
COLUMNS = tuple(c.name for c in Capture.__table__.columns if c.name not in ("id", "created_at"))
_JSON_TYPE = JSONType()


def _defaults() -> dict[str, Any]:
    """What the ORM (or the server) would put in a column left None: the model's Python or server default."""
    out: dict[str, Any] = {}
    for column in Capture.__table__.columns:
        if column.name not in COLUMNS:
            continue
        default = column.default
        if default is not None and getattr(default, "is_callable", False):
            out[column.name] = default.arg(None)
        elif default is not None and getattr(default, "is_scalar", False):
            out[column.name] = default.arg
        elif column.server_default is not None and column.name != "created_at":
            text = str(getattr(column.server_default, "arg", ""))
            out[column.name] = int(text) if text.isdigit() else text == "true"
    return out


DEFAULTS = _defaults()
_CALLABLE_DEFAULTS = {"version_spans": list, "sampling_params": dict}


_NUL_MARKS = (b"\\u0000", NUL_ESCAPE.encode())  # how orjson writes a NUL, and the escape character itself


def _values(row: Capture, columns: Sequence[str]) -> dict[str, Any]:
    """The row's plain values (read from its instance dict: no attribute machinery), defaults filled in."""
    state = row.__dict__
    values = {name: state.get(name) for name in columns}
    for name, default in DEFAULTS.items():
        if name in values and values[name] is None:
            values[name] = _CALLABLE_DEFAULTS[name]() if name in _CALLABLE_DEFAULTS else default
    status = values.get("status")
    if status is not None:
        values["status"] = CaptureStatus(status).value
    return values


def encode_row(row: Capture, dialect: Dialect) -> list[Any]:
    """The row encoded for ``dialect``: its values in ``COLUMNS`` order, as ``insert_rows`` sends them; raises on
    a value the column refuses. Token arrays are packed by ``db.types`` (as its column types pack them), then
    put in Postgres's binary array format there; JSON is serialised once (NUL-encoded on Postgres)."""
    postgres = dialect.name == "postgresql"
    values = _values(row, COLUMNS)
    for names, pack, element_oid in ((INT_ARRAYS, encode_int32, _INT4), (FLOAT_ARRAYS, encode_float32, _FLOAT4)):
        for name in names:
            if values[name] is not None:
                packed = pack(values[name])
                values[name] = _binary_array(packed, element_oid) if postgres else packed
    for name in JSON_COLUMNS:
        value = values[name]
        if value is not None:
            value = _detached(value) if name == "response_json" else value
            values[name] = _pg_json(value, dialect) if postgres else _json_text(value)
    return list(values.values())


def _pg_json(value: Any, dialect: Dialect) -> bytes:
    encoded = _json_bytes(value)
    if _NUL_MARKS[0] in encoded or _NUL_MARKS[1] in encoded:  # rare: JSONB cannot hold NUL (db.types.JSONType)
        encoded = _json_bytes(_JSON_TYPE.process_bind_param(value, dialect))
    return encoded


def _json_text(value: Any) -> str:
    return _json_bytes(value).decode()


def _json_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits, non-string keys, lone surrogates: what orjson refuses
        return json.dumps(value).encode()


def _detached(value: Any) -> Any:
    """``value`` with each string beyond ASCII replaced by an equal new one. orjson keeps the UTF-8 form of every
    such string it serialises inside the string (``PyUnicode_AsUTF8AndSize``), and a capture's reply holds the very
    strings the session keeps as the call's reply (``CallNode.reply``): serialised as they are, each non-ASCII reply
    would be held twice. The copies and their UTF-8 go when the row is written. ASCII strings are read in place,
    unchanged. (A request's strings are not kept past its call: the session holds its messages sealed.)"""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
    if isinstance(value, dict):
        return {_detached(k): _detached(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_detached(v) for v in value]
    return value


_SEQ = COLUMNS.index("seq")
_ROLLOUT = COLUMNS.index("rollout_id")


def with_seq(encoded: list[Any], seq: int) -> list[Any]:
    """An encoded row with its seq (assigned in the writer's transaction, after the row was encoded)."""
    encoded[_SEQ] = seq
    return encoded


def insert_rows(conn: Connection, rows: Sequence[list[Any]]) -> list[int]:
    """Insert the encoded ``rows`` in ``conn``'s transaction; returns their ids, in order.

    SQLite: one multi-row ``INSERT ... RETURNING``. Postgres: the ids drawn from the table's sequence in one
    query, then the rows (with their ids) streamed by one binary ``COPY``, which the server loads without
    parsing a statement, a literal or a JSON document per value. The driver's errors are raised as SQLAlchemy's
    (an integrity error is an ``IntegrityError``, a dropped connection invalidates ``conn``), as for any statement.
    """
    if conn.dialect.name != "postgresql":
        returned = driver_rows(conn, _sqlite_insert(len(rows)), tuple(v for r in rows for v in r))
        by_seq = {(rollout_id, seq): id_ for id_, rollout_id, seq in returned}
        return [by_seq[row[_ROLLOUT], row[_SEQ]] for row in rows]
    ids: list[int] = [id_ for (id_,) in driver_rows(conn, _PG_NEXT_IDS, (len(rows),))]
    raw: Any = conn.connection.driver_connection
    try:
        with raw.cursor() as cursor:
            for dumper in (_JsonbText, _EncodedInt4Array, _EncodedFloat4Array):  # set_types picks them by oid
                cursor.adapters.register_dumper(bytes, dumper)
            with cursor.copy(_PG_COPY) as copy:
                copy.set_types(_PG_TYPES)
                for id_, row in zip(ids, rows, strict=True):
                    copy.write_row((id_, *row))
    except psycopg.Error as exc:
        # SQLAlchemy's own handling of a driver error, as for a statement it ran: the engine's handle_error
        # events (an unreachable store is a StoreError), the invalidation of a dropped connection, and the
        # error re-raised as its SQLAlchemy class.
        conn._handle_dbapi_exception(exc, _PG_COPY, (), None, None)
    return ids


@functools.lru_cache(maxsize=256)
def _sqlite_insert(n_rows: int) -> str:
    one = "(" + ", ".join("?" for _ in COLUMNS) + ")"
    values = ", ".join([one] * n_rows)
    return f"INSERT INTO captures ({', '.join(COLUMNS)}) VALUES {values} RETURNING id, rollout_id, seq"


def driver_rows(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """Run ``sql`` on ``conn``'s driver cursor in its transaction and return every row it yields, without an
    execution context or a result object per statement (SQLAlchemy's cost, about twice the driver's here: the
    writer runs two or three statements a commit). ``before_cursor_execute`` listeners still see the statement
    (with no context, which SQLAlchemy allows). A driver error is raised as SQLAlchemy raises it for any statement
    (``_handle_dbapi_exception``: the engine's handle_error events, so an unreachable store is a ``StoreError``; a
    dropped connection invalidated; the error as its SQLAlchemy class)."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    if conn._has_events or conn.engine._has_events:
        for listener in conn.dispatch.before_cursor_execute:
            sql, params = listener(conn, cursor, sql, params, None, False)
    try:
        cursor.execute(sql, params)
        rows: list[Any] = cursor.fetchall()
        return rows
    except conn.dialect.loaded_dbapi.Error as exc:
        conn._handle_dbapi_exception(exc, sql, params, cursor, None)
    finally:
        cursor.close()


_INT4, _FLOAT4 = psycopg.postgres.types["int4"].oid, psycopg.postgres.types["float4"].oid


def _binary_array(items: bytes, element_oid: int) -> bytes:
    """A one-dimensional array of 4-byte little-endian ``items`` (``db.types.encode_int32``/``encode_float32``)
    in Postgres's binary format: the header, then each element big-endian after its length (numpy swaps the
    bytes of every 4-byte word at once: a float's bytes as well as an integer's, never item by item in Python)."""
    n = len(items) // 4
    if n == 0:
        return struct.pack(">iiI", 0, 0, element_oid)
    body = np.empty((n, 2), dtype=">u4")
    body[:, 0] = 4
    body[:, 1] = np.frombuffer(items, dtype="<u4", count=n)
    return struct.pack(">iiIii", 1, 0, element_oid, n, 1) + body.tobytes()


class _Encoded(psycopg.adapt.Dumper):
    """A value ``encode_row`` already put in its column's binary format (an array), sent as it is."""

    format = psycopg.pq.Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


class _EncodedInt4Array(_Encoded):
    oid = psycopg.postgres.types["int4"].array_oid


class _EncodedFloat4Array(_Encoded):
    oid = psycopg.postgres.types["float4"].array_oid


class _JsonbText(_Encoded):
    """Serialised JSON in jsonb's binary format: its version byte, then the text."""

    oid = psycopg.postgres.types["jsonb"].oid

    def dump(self, obj: Any) -> bytes:
        return b"\x01" + bytes(obj)


def _pg_copy_type(name: str) -> str:
    """A column's type as psycopg's registry names it (``int4[]``, not ``INTEGER[]`` or ``VARCHAR(36)``)."""
    compiled: str = Capture.__table__.c[name].type.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
    sql_type = compiled.lower().split("(")[0]
    base = sql_type.removesuffix("[]")
    return _PSYCOPG_NAMES.get(base, base) + sql_type[len(base) :]


_PSYCOPG_NAMES = {
    "bigint": "int8",
    "integer": "int4",
    "real": "float4",
    "double precision": "float8",
    "boolean": "bool",
}


_PG_TYPES = ["int8", *map(_pg_copy_type, COLUMNS)]
_PG_COPY = f"COPY captures (id, {', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_PG_NEXT_IDS = "SELECT nextval(pg_get_serial_sequence('captures', 'id')) FROM generate_series(1, %s)"


def advance_sql(dialect: Dialect, n_rollouts: int) -> str:
    """One counter increment for ``n_rollouts`` rollouts, each given as (id, step, key hash or NULL): a rollout
    whose key hash is given advances only while its session is open under that key. Returns (id, counter)."""
    return _advance_sql(dialect.name == "postgresql", n_rollouts)


@functools.lru_cache(maxsize=256)
def _advance_sql(postgres: bool, n_rollouts: int) -> str:
    p = "%s" if postgres else "?"
    if postgres:
        first = f"SELECT {p}::varchar AS rid, {p}::integer AS step, {p}::varchar AS key_hash"
    else:
        first = f"SELECT {p} AS rid, {p} AS step, {p} AS key_hash"
    rows = " UNION ALL ".join([first] + [f"SELECT {p}, {p}, {p}"] * (n_rollouts - 1))
    return (
        f"UPDATE rollouts SET next_capture_seq = next_capture_seq + v.step FROM ({rows}) AS v "
        "WHERE rollouts.id = v.rid AND (v.key_hash IS NULL OR "
        "(rollouts.closed_at IS NULL AND rollouts.session_token_hash = v.key_hash)) "
        "RETURNING id, next_capture_seq"
    )


def lock_sql(dialect: Dialect, n_rollouts: int) -> str | None:
    """Lock the batch's rollout rows in id order (Postgres; SQLite has one writer at a time anyway)."""
    if dialect.name != "postgresql":
        return None
    return f"SELECT id FROM rollouts WHERE id IN ({', '.join(['%s'] * n_rollouts)}) ORDER BY id FOR UPDATE"
