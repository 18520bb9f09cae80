"""The ``rl`` export's extras columns: top-k logprobs per response token and routed experts per token of the
merged trajectory (``polar.trajectory.extras``), null where the session did not capture them.

- ``top_k``; ``response_top_ids`` / ``response_top_logprobs``: one list of k per response token, empty where
  the token was not sampled (inserted tool output, user turns);
- ``routed_experts``: the (tokens, layers, k) array flattened in C order over prompt + response tokens (the last
  token's row is zeros: never routed), with ``routed_experts_shape`` = [tokens, layers, k].
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sqlalchemy.orm import Session

from db.models import Trajectory
from polar.trajectory.extras import trajectory_extras

EXTRAS_FIELDS = [
    ("top_k", pa.int32()),
    ("response_top_ids", pa.list_(pa.list_(pa.int32()))),
    ("response_top_logprobs", pa.list_(pa.list_(pa.float32()))),
    ("routed_experts", pa.list_(pa.uint16())),
    ("routed_experts_shape", pa.list_(pa.int32())),
]
_EMPTY: dict[str, Any] = {name: None for name, _ in EXTRAS_FIELDS}


def extras_columns(db: Session, trajectory: Trajectory) -> dict[str, Any]:
    """The extras columns of one trajectory's ``rl`` row."""
    extras = trajectory_extras(db, trajectory)
    if extras is None:
        return dict(_EMPTY)
    out = dict(_EMPTY)
    if extras.top_ids is not None and extras.top_logprobs is not None and extras.top_mask is not None:
        out["top_k"] = int(extras.top_ids.shape[1])
        out["response_top_ids"] = [
            row.tolist() if m else [] for row, m in zip(extras.top_ids, extras.top_mask, strict=True)
        ]
        out["response_top_logprobs"] = [
            row.tolist() if m else [] for row, m in zip(extras.top_logprobs, extras.top_mask, strict=True)
        ]
    if extras.routed_experts is not None:
        out["routed_experts"] = extras.routed_experts.reshape(-1).tolist()
        out["routed_experts_shape"] = list(extras.routed_experts.shape)
    return out
