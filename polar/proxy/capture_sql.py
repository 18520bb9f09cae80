"""The capture writer's SQL: rows encoded once, in plain Python, and written with one statement per step.

The group commit is the gateway's one database write per call, so it skips the ORM: a batch is one counter
``UPDATE ... RETURNING`` and one multi-row ``INSERT ... RETURNING`` on the raw driver, through SQLAlchemy's
``exec_driver_sql`` (its error translation stays: an unreachable store is still a ``StoreError``). Values are
encoded here exactly as the column types of ``db.types`` encode them, so a row reads back the same either way:

- token arrays: little-endian int32 / float32 bytes on SQLite; on Postgres an array literal (``{1,2,3}``)
  cast to ``int4[]`` / ``float4[]`` by the server, which is far cheaper than the driver adapting a list item by
  item. Floats are rounded to float32 first (``db.types.round_float32``), whose ``repr`` the server parses back
  to the same float32; ids go through ``array('i')``, which rejects a value outside int32 like the column type.
- JSON: serialised once by orjson (the standard encoder for what orjson refuses), NUL-encoded on Postgres
  (``db.types.JSONType``), cast to ``jsonb`` there.
- columns left unset get their model's default (``status`` OK, ``prefix_len`` 0, ...); ``created_at`` is the
  server's.

A value that cannot be encoded fails only its own row, before any statement runs.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from db.enums import CaptureStatus
from db.models import Capture
from db.types import NUL_ESCAPE, JSONType, encode_float32, encode_int32, round_float32

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


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits, non-string keys, lone surrogates: what orjson refuses
        return json.dumps(value)


_NON_FINITE = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}
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


def encode_row(row: Capture, dialect: Dialect) -> Any:
    """The row encoded for ``dialect``: its values in ``COLUMNS`` order (SQLite), or one JSON object without its
    seq (Postgres, ``insert_statement``; ``with_seq`` adds it); raises on a value the column refuses."""
    if dialect.name == "postgresql":
        return _pg_row(row, dialect)
    values = _values(row, COLUMNS)
    for name in INT_ARRAYS:
        if values[name] is not None:
            values[name] = encode_int32(values[name])
    for name in FLOAT_ARRAYS:
        if values[name] is not None:
            values[name] = encode_float32(values[name])
    for name in JSON_COLUMNS:
        if values[name] is not None:
            values[name] = _json_text(values[name])
    return list(values.values())


_PG_COLUMNS = tuple(name for name in COLUMNS if name != "seq")  # seq is assigned in the transaction: with_seq


def _pg_row(row: Capture, dialect: Dialect) -> bytes:
    """The row as one JSON object, which the server reads with ``jsonb_to_recordset``: arrays as JSON arrays
    (cast to ``int4[]``/``float4[]`` there; a non-finite float as its literal text), JSON columns nested."""
    values = _values(row, _PG_COLUMNS)
    for name in INT_ARRAYS:
        if values[name] is not None:
            values[name] = array("i", values[name]).tolist()  # the int32 check of db.types.IntArray
    for name in FLOAT_ARRAYS:
        floats = values[name]
        if floats is not None:
            floats = round_float32(floats)
            if not all(map(math.isfinite, floats)):
                floats = [v if math.isfinite(v) else _NON_FINITE[repr(v)] for v in floats]
            values[name] = floats
    encoded = _json_bytes(values)
    if any(mark in encoded for mark in _NUL_MARKS):  # rare: JSONB cannot hold NUL (db.types.JSONType)
        for name in JSON_COLUMNS:
            values[name] = _JSON_TYPE.process_bind_param(values[name], dialect)
        encoded = _json_bytes(values)
    return encoded


def _json_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


_SEQ = COLUMNS.index("seq")


def with_seq(encoded: Any, seq: int) -> Any:
    """An encoded row with its seq (assigned in the writer's transaction, after the row was encoded)."""
    if isinstance(encoded, bytes):
        return b'{"seq":%d,' % seq + encoded[1:]
    encoded[_SEQ] = seq
    return encoded


def _pg_type(name: str) -> str:
    return str(Capture.__table__.c[name].type.compile(dialect=postgresql.dialect()))


_PG_INSERT = (
    f"INSERT INTO captures ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} "
    f"FROM jsonb_to_recordset(%s::jsonb) AS t({', '.join(f'{name} {_pg_type(name)}' for name in COLUMNS)}) "
    "RETURNING id, rollout_id, seq"
)


def insert_statement(dialect: Dialect, rows: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``INSERT INTO captures`` of the encoded ``rows`` and its parameters; the statement returns each row's id
    with its (rollout_id, seq). On Postgres the rows travel as one JSON array: one parameter whatever the batch
    size, parsed by the server, not adapted value by value by the driver."""
    if dialect.name == "postgresql":
        return _PG_INSERT, ((b"[" + b",".join(rows) + b"]").decode(),)
    one = "(" + ", ".join("?" for _ in COLUMNS) + ")"
    values = ", ".join([one] * len(rows))
    sql = f"INSERT INTO captures ({', '.join(COLUMNS)}) VALUES {values} RETURNING id, rollout_id, seq"
    return sql, tuple(value for row in rows for value in row)


def advance_sql(dialect: Dialect, n_rollouts: int) -> str:
    """One counter increment for ``n_rollouts`` rollouts, each given as (id, step, key hash or NULL): a rollout
    whose key hash is given advances only while its session is open under that key. Returns (id, counter)."""
    p = "%s" if dialect.name == "postgresql" else "?"
    if dialect.name == "postgresql":
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
