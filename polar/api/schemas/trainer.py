"""Replies of the trainer feed: a claimed batch of complete groups, and what ack, release and renew report
(``/v1/claims``; ``polar.feed.claims`` holds the records they are made of)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from db.enums import ClaimStatus
from polar.api.schemas.base import Reply


class FeedTrajectory(Reply):
    """One training sequence: ``response_ids``, ``loss_mask`` and ``response_logprobs`` are aligned."""

    id: int
    rollout_id: str
    sample_index: int
    chain_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]
    reward: float | None
    status: str
    filter_reason: str | None
    weight_version_min: str | None
    weight_version_max: str | None
    kept: bool = Field(description="the chain the harness kept")
    version_spans: list[dict[str, Any]] = Field(description="weight version per span of response positions")
    sampling_spans: list[dict[str, Any]] | None = Field(
        description="sampling regime per span of response positions (null on rows built before revision 0020)"
    )


class FeedGroup(Reply):
    """One task's complete group (every sample finished)."""

    task_id: str
    name: str | None
    metadata: dict[str, Any]
    builder: str
    staleness: int = Field(description="how many versions behind the current one its oldest sample is")
    trajectories: list[FeedTrajectory]


class ClaimedBatch(Reply):
    claim_id: str | None = Field(description="null when no complete group was claimable")
    trainer: str
    lease_expires_at: str | None = Field(description="ISO 8601; ack, release or renew before then")
    current_version: str | None
    groups: list[FeedGroup]


class Acked(Reply):
    claim_id: str
    status: ClaimStatus
    groups: int
    trajectories: int = Field(description="trajectories now consumed by the trainer")


class Released(Reply):
    claim_id: str
    status: ClaimStatus
    groups: int


class Renewed(Reply):
    claim_id: str
    lease_expires_at: str = Field(description="ISO 8601")
