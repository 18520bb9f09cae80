"""Top-k logprobs and routed experts of a merged trajectory: the captures' per-call deltas stitched along the
capture tree so the trajectory has exactly one entry per token, prompt and response.

Each capture holds top-k rows for the ids it sampled and routed-experts rows for positions
``[experts_start, n_prompt + n_output - 1)`` of its own sequence (``polar.capture_extras``). Walking the path from
the tree's root to a chain's last capture, a capture sharing ``prefix_len`` ids with its parent keeps the first
``prefix_len`` positions of what was stitched so far (experts: its ``experts_start``, which is at most that) and
appends its own rows. The result covers the last capture's whole sequence:

- top-k: (n, k) ids (int32) and logprobs (float32) with ``top_mask`` True where the model sampled the id (prompt
  and inserted tokens have no top-k: id -1, logprob 0);
- routed experts: (n, layers, k) for every position. The last position's routing was never computed (a server
  never feeds the id it sampled last): its row is zeros and ``experts_mask`` is False there; it changes no
  trained logprob (nothing is predicted after it).

A trajectory whose tokens are not its last capture's sequence (an inexact merge replaced a re-rendered reply by
the sampled ids) gets no extras: they would not be the ones its tokens were computed with.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import Capture, Trajectory
from polar.capture_extras import stored_extras
from polar.errors import NotFound
from polar.trajectory.records import Trace

_COLUMNS = (
    Capture.id,
    Capture.parent_id,
    Capture.prefix_len,
    Capture.prompt_delta_ids,
    Capture.output_ids,
    Capture.n_prompt,
    Capture.n_output,
    Capture.top_k,
    Capture.top_ids,
    Capture.top_logprobs,
    Capture.experts_start,
    Capture.experts_layers,
    Capture.experts_k,
    Capture.routed_experts,
)


@dataclass(frozen=True, eq=False)
class SequenceExtras:
    """Per-token extras of one sequence of ``len(ids)`` tokens (None where no capture of the path had them)."""

    ids: np.ndarray
    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    top_mask: np.ndarray | None
    routed_experts: np.ndarray | None
    experts_mask: np.ndarray | None


def stitch(path: Sequence[Any]) -> SequenceExtras:
    """The extras of the last capture's sequence, from the captures of its root-to-leaf ``path`` (objects with the
    capture columns as attributes: ORM rows or SQL rows)."""
    ids = np.zeros(0, np.int32)
    k = next((int(c.top_k) for c in path if c.top_k), 0)
    top_ids = np.zeros((0, k), np.int32)
    top_lp = np.zeros((0, k), np.float32)
    top_mask = np.zeros(0, bool)
    has_top = bool(k)
    experts: np.ndarray | None = None
    has_experts = True
    for capture in path:
        keep = int(capture.prefix_len or 0)
        delta = np.asarray(capture.prompt_delta_ids, np.int32)
        output = np.asarray(capture.output_ids, np.int32)
        ids = np.concatenate([ids[:keep], delta, output])
        stored = stored_extras(capture)
        if stored.top_ids is None or stored.top_ids.shape[1] != k:
            has_top = False
        elif has_top:
            fill = len(delta)
            top_ids = np.concatenate([top_ids[:keep], np.full((fill, k), -1, np.int32), stored.top_ids])
            top_lp = np.concatenate([top_lp[:keep], np.zeros((fill, k), np.float32), stored.top_logprobs])
            top_mask = np.concatenate([top_mask[:keep], np.zeros(fill, bool), np.ones(len(output), bool)])
        rows = stored.routed_experts
        if rows is None or (experts is not None and (stored.experts_start > len(experts))):
            has_experts = False  # a call without them, or a gap (its parent's rows end before it starts)
        elif has_experts:
            start = stored.experts_start
            if experts is None:
                has_experts = start == 0
                experts = rows
            else:
                experts = np.concatenate([experts[:start], rows])  # uint8 and uint16 rows promote
    n = len(ids)
    experts_out = experts_mask = None
    if has_experts and experts is not None and len(experts) == max(n - 1, 0):
        experts_out = np.concatenate([experts, np.zeros((1, *experts.shape[1:]), experts.dtype)]) if n else experts
        experts_mask = np.arange(n) < n - 1
    return SequenceExtras(
        ids=ids,
        top_ids=top_ids if has_top else None,
        top_logprobs=top_lp if has_top else None,
        top_mask=top_mask if has_top else None,
        routed_experts=experts_out,
        experts_mask=experts_mask,
    )


def path_to(db: Session, capture_id: int) -> list[Any]:
    """The captures from the tree's root down to ``capture_id`` (only the columns ``stitch`` reads), read with one
    query over the capture's rollout."""
    rollout_id = db.scalar(sa.select(Capture.rollout_id).where(Capture.id == capture_id))
    if rollout_id is None:
        return []
    rows = {row.id: row for row in db.execute(sa.select(*_COLUMNS).where(Capture.rollout_id == rollout_id))}
    path: list[Any] = []
    next_id: int | None = capture_id
    while next_id is not None and next_id in rows:
        path.append(rows[next_id])
        next_id = rows[next_id].parent_id
    return path[::-1]


@dataclass(frozen=True, eq=False)
class TrajectoryExtras:
    """A trajectory's extras: top-k per response token (``top_mask`` True on sampled tokens, trained or carried as
    context) and routed experts per token of prompt + response."""

    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    top_mask: np.ndarray | None
    routed_experts: np.ndarray | None
    experts_mask: np.ndarray | None

    @property
    def any(self) -> bool:
        return self.top_ids is not None or self.routed_experts is not None


def trajectory_extras(db: Session, trajectory: Trajectory | Trace) -> TrajectoryExtras | None:
    """The extras of ``trajectory`` (None when its captures have none, or its tokens are not its last capture's)."""
    if not trajectory.capture_ids:
        return None
    path = path_to(db, trajectory.capture_ids[-1])
    if not any(c.top_k or c.routed_experts is not None for c in path):
        return None
    stitched = stitch(path)
    tokens = np.concatenate(
        [np.asarray(trajectory.prompt_ids, np.int32), np.asarray(trajectory.response_ids, np.int32)]
    )
    if not np.array_equal(tokens, stitched.ids):
        return None
    start = len(trajectory.prompt_ids)
    top = stitched.top_ids is not None and stitched.top_logprobs is not None and stitched.top_mask is not None
    return TrajectoryExtras(
        top_ids=stitched.top_ids[start:] if top else None,  # type: ignore[index]
        top_logprobs=stitched.top_logprobs[start:] if top else None,  # type: ignore[index]
        top_mask=stitched.top_mask[start:] if top else None,  # type: ignore[index]
        routed_experts=stitched.routed_experts,
        experts_mask=stitched.experts_mask,
    )


def extras_json(trajectory_id: int, extras: TrajectoryExtras | None) -> dict[str, Any]:
    """The control API's view of a trajectory's extras (``GET /v1/trajectories/{id}/extras``): top-k as lists per
    response token (``mask`` 1 where the id was sampled), routed experts as base64 of the (tokens, layers, k)
    array in ``dtype`` (little-endian), one row per prompt and response token (``mask`` 0 on the last)."""
    top = experts = None
    if extras is not None and extras.top_ids is not None and extras.top_logprobs is not None:
        assert extras.top_mask is not None
        top = {
            "k": int(extras.top_ids.shape[1]),
            "ids": extras.top_ids.tolist(),
            "logprobs": extras.top_logprobs.tolist(),
            "mask": extras.top_mask.astype(int).tolist(),
        }
    if extras is not None and extras.routed_experts is not None:
        assert extras.experts_mask is not None
        array = extras.routed_experts
        dtype = "uint16" if array.dtype.itemsize == 2 else "uint8"
        experts = {
            "shape": list(array.shape),
            "dtype": dtype,
            "data": base64.b64encode(array.astype("<u2" if dtype == "uint16" else "u1").tobytes()).decode(),
            "mask": extras.experts_mask.astype(int).tolist(),
        }
    return {"trajectory_id": trajectory_id, "top_logprobs": top, "routed_experts": experts}


def extras_from_json(body: dict[str, Any]) -> TrajectoryExtras:
    """``extras_json``'s output as arrays again (what trainer adapters read)."""
    top, routed = body.get("top_logprobs"), body.get("routed_experts")
    experts = mask = None
    if routed:
        dtype = "<u2" if routed["dtype"] == "uint16" else "u1"
        experts = np.frombuffer(base64.b64decode(routed["data"]), dtype=dtype).reshape(routed["shape"])
        mask = np.asarray(routed["mask"], bool)
    return TrajectoryExtras(
        top_ids=np.asarray(top["ids"], np.int32).reshape(-1, top["k"]) if top else None,
        top_logprobs=np.asarray(top["logprobs"], np.float32).reshape(-1, top["k"]) if top else None,
        top_mask=np.asarray(top["mask"], bool) if top else None,
        routed_experts=experts,
        experts_mask=mask,
    )


def trajectory_extras_view(db: Session, trajectory_id: int) -> dict[str, Any]:
    """``extras_json`` of a stored trajectory; NotFound when there is none with that id."""
    trajectory = db.get(Trajectory, trajectory_id)
    if trajectory is None:
        raise NotFound(f"no trajectory {trajectory_id}", field="trajectory_id")
    return extras_json(trajectory_id, trajectory_extras(db, trajectory))
