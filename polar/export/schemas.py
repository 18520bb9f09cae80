"""Parquet schemas of the exports. Token arrays are typed lists (int32 ids, int8 mask, float32 logprobs);
messages are a list of structs with every OpenAI field (absent ones null); free-form JSON (task metadata, tool
schemas, version and sampling spans) is stored as JSON text.

JSONL rows carry the same fields, with messages as plain objects that omit absent fields.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from polar.export.extras import EXTRAS_FIELDS

_COMMON = [
    ("trajectory_id", pa.int64()),
    ("task_id", pa.string()),
    ("task_name", pa.string()),
    ("rollout_id", pa.string()),
    ("sample_index", pa.int32()),
    ("harness", pa.string()),
    ("builder", pa.string()),
    ("chain_index", pa.int32()),
    ("reward", pa.float64()),
    ("status", pa.string()),
    ("finish_reason", pa.string()),
    ("weight_version_min", pa.string()),
    ("weight_version_max", pa.string()),
    ("turn_count", pa.int32()),
    ("role", pa.string()),  # main | sub_agent | compaction | title | other
    ("source_capture_id", pa.int64()),  # the call the chain came from (launcher, summarised call, compaction)
    ("compacted", pa.bool_()),  # the chain starts from a compaction summary
    ("sampling_spans", pa.string()),  # JSON: the sampling regime per response span (null: not recorded)
    ("created_at", pa.string()),
    ("metadata", pa.string()),  # JSON
]

RL_SCHEMA = pa.schema(
    [
        *_COMMON,
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("version_spans", pa.string()),  # JSON
        ("n_prompt", pa.int32()),
        ("n_response", pa.int32()),
        ("n_loss_tokens", pa.int32()),
        ("kept", pa.bool_()),  # the chain the harness kept: what outcome-reward training reads
        ("filter_reason", pa.string()),  # why the fail-closed filter zeroed the mask or the reward (null: untouched)
        *EXTRAS_FIELDS,  # top-k logprobs and routed experts (polar.export.extras), null where not captured
    ]
)

TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)
SFT_SCHEMA = pa.schema(
    [
        *_COMMON,
        ("instruction", pa.string()),
        ("messages", pa.list_(MESSAGE)),
        ("tools", pa.string()),  # JSON
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
    ]
)

_JSON_COLUMNS = ("metadata", "version_spans", "tools")
_NULLABLE_JSON = ("sampling_spans",)  # null stays null (not the text "null"): the regime was not recorded
_MESSAGE_KEYS = [field.name for field in MESSAGE]


def to_arrow_row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in _JSON_COLUMNS:
        if key in out:
            out[key] = json.dumps(out[key], ensure_ascii=False, separators=(",", ":"))
    for key in _NULLABLE_JSON:
        if out.get(key) is not None:
            out[key] = json.dumps(out[key], separators=(",", ":"))
    if "messages" in out:
        out["messages"] = [{key: message.get(key) for key in _MESSAGE_KEYS} for message in out["messages"]]
    return out


def from_parquet_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message read back from parquet, in the JSONL shape (absent fields dropped)."""
    return {key: value for key, value in message.items() if value is not None}
