"""Replies about rollouts: a rollout with its evaluations, and its token record (``GET /v1/rollouts/...``).

Timestamps are ISO 8601 strings as ``datetime.isoformat`` writes them (UTC, ``+00:00``)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from db.enums import RolloutStatus
from polar.api.schemas.base import Reply
from polar.evaluators.components import RewardComponents


class RolloutView(Reply):
    """One rollout (one sample of a task: one gateway session)."""

    rollout_id: str
    task_id: str | None = Field(description="null for a session without a task")
    sample_index: int
    status: RolloutStatus
    stage: str | None = Field(description="the last completed stage")
    reward: float | None
    error: str | None
    attempt: int
    weight_version_min: str | None
    weight_version_max: str | None
    flow_run_id: str | None = Field(description="the Prefect flow run created for it (deployment dispatch)")
    stage_timings: dict[str, Any]
    created_at: str | None
    finished_at: str | None


class EvaluationView(Reply):
    evaluator: str
    reward: float
    duration_s: float | None
    components: RewardComponents = Field(description="the details read as typed reward components")
    details: dict[str, Any] = Field(description="the evaluator's details as it wrote them")


class RolloutDetail(RolloutView):
    evaluations: list[EvaluationView]


class TokenRecord(Reply):
    """One build's account of a rollout's sampled tokens (``db.models.MergeStat``): every token not trained has a
    reason in ``untrained_tokens`` (poisoned, dead_branch, ambiguous_witness, unacknowledged, and the training
    filter's: role_not_trained, rollout_error, ...); ``trainable_tokens`` is counted after the filter."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    builder: str
    captures_in: int
    error_captures: int
    traces_out: int
    roots: int
    breaks: int
    break_causes: dict[str, int]
    roots_by_role: dict[str, int] = Field(default_factory=dict)
    root_causes: dict[str, int] = Field(default_factory=dict)
    sampled_tokens: int
    loss_tokens: int = Field(description="tokens in the loss mask before the training filter")
    trainable_tokens: int | None = Field(description="tokens trained after the filter; null for builds before 0017")
    untrained_tokens: dict[str, int] = Field(default_factory=dict)


class RolloutStats(Reply):
    rollout_id: str
    builds: list[TokenRecord]
