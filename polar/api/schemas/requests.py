"""Request bodies of the control API (pydantic: unknown fields are refused, errors name the field)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from polar.rollout.spec import TaskRequest


class RequestBody(BaseModel):
    """A JSON request body: an unknown field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")


class TaskBatch(RequestBody):
    tasks: list[TaskRequest] = Field(
        min_length=1, max_length=10_000, description="tasks to run; each sample is a rollout"
    )


class ClaimRequest(RequestBody):
    trainer: str = Field(min_length=1, max_length=128, description="who claims (a trainer's stable name)")
    max_groups: int = Field(default=1, ge=1, le=10_000, description="at most this many complete groups")
    lease_s: float | None = Field(default=None, gt=0, le=86_400, description="lease; default POLAR_CLAIM_LEASE_S")
    max_staleness: int | None = Field(
        default=None, ge=0, le=1_000_000, description="skip groups sampled more versions ago than this"
    )


class TrainerBody(RequestBody):
    trainer: str = Field(min_length=1, max_length=128)


class RenewRequest(TrainerBody):
    lease_s: float = Field(gt=0, le=86_400)


class WeightsRequest(RequestBody):
    version: str = Field(min_length=1, max_length=128, description="the new version's name (unique)")
    checkpoint_path: str | None = Field(default=None, min_length=1, description="safetensors folder the backends read")
    notes: str | None = Field(default=None, max_length=10_000)
