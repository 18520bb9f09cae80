"""Replies about trajectories: filtered lists, and one trajectory's extras (``/v1/trajectories``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polar.api.schemas.base import Reply


class TrajectoryView(Reply):
    """One training sequence of a rollout (``db.models.Trajectory``). The token arrays are there only when the
    request asked for them (``tokens=true``): their keys are absent otherwise, not null."""

    id: int
    rollout_id: str
    task_id: str | None = Field(description="null for a session without a task")
    builder: str
    chain_index: int
    status: str = Field(description="the outcome of the rollout it came from")
    reward: float | None
    turn_count: int
    n_prompt: int
    n_response: int
    n_loss_tokens: int
    finish_reason: str | None
    filter_reason: str | None = Field(description="why the training filter zeroed its mask or reward, if it did")
    role: str = Field(description="main, sub_agent, compaction, title or other")
    source_capture_id: int | None
    compacted: bool
    kept: bool = Field(description="the chain the harness kept (what the trainer adapters train per rollout)")
    weight_version_min: str | None
    weight_version_max: str | None
    consumed_by: str | None = Field(description="the trainer that acknowledged it")
    created_at: str | None = Field(description="ISO 8601")
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    loss_mask: list[int] | None = Field(default=None, description="aligned with response_ids")
    response_logprobs: list[float] | None = Field(default=None, description="aligned with response_ids")
    sampling_spans: list[dict[str, Any]] | None = Field(
        default=None, description="the sampling regime per span of response_ids (null: not recorded)"
    )


class TrajectoryList(Reply):
    trajectories: list[TrajectoryView] = Field(description="oldest first")


class TopLogprobs(Reply):
    k: int
    ids: list[list[int]] = Field(description="k token ids per response token")
    logprobs: list[list[float]] = Field(description="their logprobs")
    mask: list[int] = Field(description="1 where the token was sampled")


class RoutedExperts(Reply):
    shape: list[int] = Field(description="(tokens, layers, k): one row per prompt and response token")
    dtype: Literal["uint16", "uint8"]
    data: str = Field(description="base64 of the little-endian array")
    mask: list[int] = Field(description="0 on the last token")


class TrajectoryExtrasView(Reply):
    """Top-k logprobs and routed experts (``polar.trajectory.extras.extras_from_json`` reads them as arrays);
    null where its session did not capture them."""

    trajectory_id: int
    top_logprobs: TopLogprobs | None
    routed_experts: RoutedExperts | None
