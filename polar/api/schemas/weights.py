"""Replies about weight versions: the registered ones, and a publication's (``/v1/weights``)."""

from __future__ import annotations

from pydantic import Field

from polar.api.schemas.base import Reply


class VersionView(Reply):
    version: str
    ordinal: int = Field(description="1 for the first version registered, then 2, ...")
    created_at: str = Field(description="ISO 8601")
    checkpoint_uri: str | None = Field(description="the checkpoint folder, or tensors://uploaded")
    notes: str | None


class Versions(Reply):
    versions: list[VersionView] = Field(description="oldest first")
    current: str | None = Field(description="the last one registered")


class PushView(Reply):
    target: str = Field(description="a gateway's base URL")
    attempts: int
    error: str | None = Field(description="null: the gateway serves the version")


class Published(VersionView):
    """A version every target gateway serves, now registered as current."""

    targets: list[str]
    pushes: list[PushView]
