"""Read model of one rollout's page: task, stages, evaluations, failure, the capture tree and the trajectories.

Captures are loaded without their JSON bodies and token arrays (a 200-turn session's request bodies can be
megabytes); the page fetches a capture's request and response when it is opened (``capture_json``). How each
capture joined the merged chains comes from ``prefix_merge.link_kinds`` over the same records the builders read,
so the tree shows the builder's own decisions, never a second guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, defer

from db.capture_tree import CaptureTreeError
from db.models import Capture, Evaluation, MergeStat, Rollout, Task, Trajectory
from db.request_json import full_request_json, is_delta
from db.stage_results import Failure, StageResults
from db.stage_timings import StageTimings
from polar.errors import NotFound
from polar.evaluators.components import RewardComponents, reward_components
from polar.trajectory.prefix_merge import link_kinds
from polar.trajectory.store import load_capture_records
from polar.ui.listing import STAGES

# A trajectory's arrays load only for the pages shown (a long session's traces hold 100k+ tokens in all).
_TOKEN_ARRAYS = (Trajectory.prompt_ids, Trajectory.response_ids, Trajectory.loss_mask, Trajectory.response_logprobs)

KIND_LABELS = {
    "root": "root",
    "exact": "merged",
    "inexact": "merged (re-rendered reply)",
    "failed": "failed call",
}


@dataclass(frozen=True)
class StageRow:
    name: str
    status: str  # done | running | failed | pending
    started_at: str | None
    finished_at: str | None
    duration_s: float | None
    attempts: int
    where: str | None
    result: dict[str, Any]


@dataclass
class CaptureNode:
    id: int
    seq: int
    parent_id: int | None
    status: str
    kind: str
    role: str | None
    protocol: str
    model: str
    n_prompt: int
    n_prompt_delta: int
    n_output: int
    prefix_len: int
    finish_reason: str | None
    weight_version: str | None
    latency_s: float | None
    ttft_s: float | None
    malformed: int
    error: str | None
    children: list[CaptureNode] = field(default_factory=list)

    @property
    def is_break(self) -> bool:
        return self.parent_id is not None and self.kind not in ("exact", "inexact", "failed")

    @property
    def kind_label(self) -> str:
        return KIND_LABELS.get(self.kind, f"break: {self.kind}")


@dataclass(frozen=True)
class TreeRow:
    """A capture in the tree's display order (depth first, children by seq). ``depth`` grows only where a
    capture has several children, so a long linear session stays one column instead of 200 nested levels."""

    node: CaptureNode
    depth: int


def tree_rows(roots: list[CaptureNode]) -> list[TreeRow]:
    rows: list[TreeRow] = []
    stack = [(root, 0) for root in reversed(roots)]
    while stack:  # iterative: a 1,000-turn chain must not hit the recursion limit
        node, depth = stack.pop()
        rows.append(TreeRow(node, depth))
        child_depth = depth if len(node.children) == 1 else depth + 1
        stack.extend((child, child_depth) for child in reversed(node.children))
    return rows


@dataclass(frozen=True)
class RolloutDetail:
    rollout: Rollout
    task: Task | None
    harness: str | None
    stages: list[StageRow]
    evaluations: list[Evaluation]
    components: list[RewardComponents]  # one per evaluation, in the same order
    failure: Failure | None
    previous_failures: list[dict[str, Any]]
    roots: list[CaptureNode]
    tree: list[TreeRow]
    n_captures: int
    tree_error: str | None
    merge_stats: list[MergeStat]
    trajectories: list[Trajectory]
    builder: str | None


def stage_rows(row: Rollout, results: StageResults) -> list[StageRow]:
    """One row per stage, from the rollout's timings and its ``results`` (``row.results``, read once)."""
    timings = StageTimings.of(row.stage_timings)
    failed = results.failure.stage if results.failure is not None else None
    out = []
    for name in STAGES:
        timing = timings.stage(name)
        if timing.finished:
            status = "done"
        elif failed == name:
            status = "failed"
        elif timing.started_at:
            status = "running" if not row.status.is_terminal else "stopped"
        else:
            status = "pending"
        result = results.stage(name)
        out.append(
            StageRow(
                name=name,
                status=status,
                started_at=timing.started_at,
                finished_at=timing.finished_at,
                duration_s=timing.duration_s,
                attempts=timing.attempts,
                where=str(timing.where) if timing.where is not None else None,
                result=result.as_json() if result is not None else {},  # shown as stored
            )
        )
    return out


def capture_tree(db: Session, rollout_id: str) -> tuple[list[CaptureNode], int, str | None]:
    """The rollout's captures as a forest (children by seq), how many, and a tree-contract error if any."""
    rows = db.scalars(
        sa.select(Capture)
        .where(Capture.rollout_id == rollout_id)
        .order_by(Capture.seq)
        .options(
            defer(Capture.request_json),
            defer(Capture.response_json),
            defer(Capture.prompt_delta_ids),
            defer(Capture.output_ids),
            defer(Capture.output_logprobs),
        )
    ).all()
    tree_error = None
    try:
        kinds = link_kinds(load_capture_records(db, rollout_id))
    except CaptureTreeError as exc:  # show the captures anyway, with what is wrong with them
        kinds, tree_error = {}, str(exc)
    nodes: dict[int, CaptureNode] = {}
    roots: list[CaptureNode] = []
    for row in rows:
        node = CaptureNode(
            id=row.id,
            seq=row.seq,
            parent_id=row.parent_id,
            status=row.status.value,
            kind=kinds.get(row.id, "root" if row.parent_id is None else "unknown"),
            # Root roles (main, sub_agent, compaction, title) are shown when the store records them.
            role=getattr(row, "role", None),
            protocol=row.protocol,
            model=row.model,
            n_prompt=row.n_prompt,
            n_prompt_delta=row.n_prompt_delta,
            n_output=row.n_output,
            prefix_len=row.prefix_len,
            finish_reason=row.finish_reason,
            weight_version=row.weight_version,
            latency_s=row.latency_s,
            ttft_s=row.ttft_s,
            malformed=row.n_malformed_tool_calls,
            error=row.error,
        )
        nodes[row.id] = node
        parent = nodes.get(row.parent_id) if row.parent_id is not None else None
        (parent.children if parent is not None else roots).append(node)
    return roots, len(rows), tree_error


def rollout_detail(db: Session, rollout_id: str) -> RolloutDetail:
    row = db.get(Rollout, rollout_id)
    if row is None:
        raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
    task = db.get(Task, row.task_id) if row.task_id else None
    roots, n_captures, tree_error = capture_tree(db, rollout_id)
    results = row.results
    builder = task.builder if task is not None else None
    trajectories = db.scalars(
        sa.select(Trajectory)
        .where(Trajectory.rollout_id == rollout_id)
        .options(*(defer(column) for column in _TOKEN_ARRAYS))
        .order_by(Trajectory.builder != (builder or ""), Trajectory.builder, Trajectory.chain_index)
    ).all()
    evaluations = list(
        db.scalars(sa.select(Evaluation).where(Evaluation.rollout_id == rollout_id).order_by(Evaluation.id))
    )
    return RolloutDetail(
        rollout=row,
        task=task,
        harness=(task.harness or {}).get("name") if task is not None else None,
        stages=stage_rows(row, results),
        evaluations=evaluations,
        components=[reward_components(e.evaluator, e.reward, e.details) for e in evaluations],
        failure=results.failure,
        previous_failures=[failure.model_dump(mode="json") for failure in results.previous_failures],
        roots=roots,
        tree=tree_rows(roots),
        n_captures=n_captures,
        tree_error=tree_error,
        merge_stats=list(db.scalars(sa.select(MergeStat).where(MergeStat.rollout_id == rollout_id))),
        trajectories=list(trajectories),
        builder=builder,
    )


def trajectory_row(db: Session, trajectory_id: int) -> Trajectory:
    row = db.get(Trajectory, trajectory_id)
    if row is None:
        raise NotFound(f"no trajectory {trajectory_id}", field="trajectory_id")
    return row


def capture_json(db: Session, capture_id: int, *, full: bool) -> dict[str, Any]:
    """A capture's request (as stored, a delta from its parent's, or ``full``: rebuilt) and its response."""
    row = db.get(Capture, capture_id)
    if row is None:
        raise NotFound(f"no capture {capture_id}", field="capture_id")
    stored = row.request_json
    return {
        "capture_id": row.id,
        "request_is_delta": is_delta(stored),
        "request": full_request_json(db, row) if full else stored,
        "response": row.response_json,
        "latency_s": row.latency_s,
        "ttft_s": row.ttft_s,
        "sampling_params": row.sampling_params,
        "version_spans": row.version_spans,
    }
