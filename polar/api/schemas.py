"""Request bodies of the control API (pydantic: unknown fields are refused, errors name the field)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from polar.rollout.spec import TaskRequest


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskBatch(_Body):
    tasks: list[TaskRequest] = Field(
        min_length=1, max_length=10_000, description="tasks to run; each sample is a rollout"
    )


class ClaimRequest(_Body):
    trainer: str = Field(min_length=1, max_length=128, description="who claims (a trainer's stable name)")
    max_groups: int = Field(default=1, ge=1, le=10_000, description="at most this many complete groups")
    lease_s: float | None = Field(default=None, gt=0, le=86_400, description="lease; default POLAR_CLAIM_LEASE_S")
    max_staleness: int | None = Field(
        default=None, ge=0, le=1_000_000, description="skip groups sampled more versions ago than this"
    )


class TrainerBody(_Body):
    trainer: str = Field(min_length=1, max_length=128)


class RenewRequest(TrainerBody):
    lease_s: float = Field(gt=0, le=86_400)


class WeightsRequest(_Body):
    version: str = Field(min_length=1, max_length=128, description="the new version's name (unique)")
    checkpoint_path: str | None = Field(default=None, min_length=1, description="safetensors folder the backends read")
    notes: str | None = Field(default=None, max_length=10_000)


class TokenRecord(BaseModel):
    """One build's account of a rollout's sampled tokens (``db.models.MergeStat``): every token not trained has a
    reason in ``untrained_tokens`` (poisoned, dead_branch, ambiguous_witness, unacknowledged, and the training
    filter's: role_not_trained, rollout_error, ...); ``trainable_tokens`` is counted after the filter."""

    model_config = ConfigDict(from_attributes=True)

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


class RolloutStats(BaseModel):
    rollout_id: str
    builds: list[TokenRecord]
