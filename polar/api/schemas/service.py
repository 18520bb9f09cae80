"""Replies of the routes outside ``/v1``'s resources: liveness, the served model, and every error."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.api.schemas.base import Reply


class Health(Reply):
    status: Literal["ok"] = Field(description="always ok while the process serves")
    dispatch: str = Field(description="how submitted tasks start: inline or deployment")
    store: Literal["ok", "unavailable"] = Field(description="unavailable: it did not answer in POLAR_HEALTH_TIMEOUT_S")
    current_version: str | None = Field(description="the current weight version; null with none or no store")


class TokenizerInfo(Reply):
    name: str
    vocab_size: int
    fingerprint: str = Field(description="a trainer's tokenizer must have the same one")


class ModelInfo(Reply):
    model: str = Field(description="the model the gateways serve under these settings")
    tokenizer: TokenizerInfo


class ErrorDetail(Reply):
    type: str = Field(description="the error's class, e.g. invalid_request_error, not_found_error, store_unavailable")
    message: str
    field: str | None = Field(description="the request field at fault, dotted (tasks.0.policies), if one is")


class ErrorReply(Reply):
    """Every error's body, with the status of its class (``polar.errors``); a retryable one (a store outage) has
    a ``Retry-After`` header too."""

    error: ErrorDetail
