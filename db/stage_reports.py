"""The parts a stage result is made of: prepare reports, evaluation-runtime reports, artifact summaries and
trajectory build summaries; and ``StoredRecord``, the base of every typed record of a rollout's JSON columns.

A record is written as ``record.as_json()``: exactly the keys it was given (``exclude_unset``), in the order its
fields are declared, then what its model does not name (``extra="allow"``). So a writer that passes the keys it
always wrote stores the same JSON as before there were records, and a record read from a row and stored again
is the row's JSON unchanged. Field order follows the order the stages write them.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field


class StoredRecord(BaseModel):
    """A typed record of a rollout's JSON columns (frozen; unknown keys kept)."""

    # strict: a stored "yes" is not a bool, and a number stored as a string is not a number (no guessing)
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    def as_json(self) -> dict[str, Any]:
        """The record as its column holds it: the keys it was given, nothing filled in from defaults."""
        return self.model_dump(mode="json", exclude_unset=True)

    def merged(self, later: Self) -> Self:
        """This record with ``later``'s keys written over it (validated again, as the column would be read)."""
        return self.model_validate({**self.as_json(), **later.as_json()})


class PrepareReport(StoredRecord):
    """One prepare action that succeeded: which, how many tries, their errors, how long in all."""

    action: int
    type: str
    attempts: int
    errors: list[str] = Field(default_factory=list)
    duration_s: float = 0.0


class RuntimeReport(StoredRecord):
    """How a runtime was readied for the evaluator: the evaluation runtime prepared during the run (the run's
    ``eval_runtime``; ``error`` when that failed), prepared or reused by evaluate (``fresh_runtime``), or the
    agent's runtime rebuilt on another host (``rebuilt_runtime``), with the agent's changes applied."""

    reused: bool = False
    rebuilt: bool = False
    runtime: dict[str, Any] = Field(default_factory=dict)  # the runtime's own description (``Runtime.describe``)
    prepare: list[PrepareReport] = Field(default_factory=list)
    error: str | None = None
    applied_diff: bool = False
    restored_work: bool = False
    copied: list[str] = Field(default_factory=list)
    from_artifacts: bool = False


class KeptArtifact(StoredRecord):
    """An artifact's manifest entry (``artifact_store``): its size and hash, where, and whether it was stored."""

    size: int | None = None
    sha256: str | None = None
    url: str | None = None
    stored: bool = False
    reason: str | None = None  # why it was not stored
    absent: bool = False  # the agent left no such file


class ArtifactSummary(StoredRecord):
    """What was collected of the working folder: a git diff (``git``), or the list of its files; ``kept`` maps
    each artifact kept for another host to its manifest entry. ``error``: collecting or keeping them failed."""

    git: bool | None = None
    files: list[str] = Field(default_factory=list)
    file_count: int | None = None
    diff: str | None = None  # its first characters
    diff_bytes: int | None = None
    diff_truncated: bool = False
    changed: list[str] = Field(default_factory=list)
    patch_file: str | None = None
    error: str | None = None
    kept: dict[str, KeptArtifact] = Field(default_factory=dict)

    @property
    def has_diff(self) -> bool:
        """A git diff was collected (it may be empty)."""
        return bool(self.git) and self.diff_bytes is not None

    def entry(self, name: str) -> KeptArtifact:
        """``name``'s manifest entry; an empty one (not stored) when it was never kept."""
        return self.kept.get(name) or KeptArtifact()


class BuildSummary(StoredRecord):
    """The trajectories built from the rollout's captures, or (``kept``) why the built ones were kept as they are."""

    builder: str | None = None
    captures: int = 0
    error_captures: int = 0
    trajectories: int = 0
    loss_tokens: int = 0
    filter: list[str] = Field(default_factory=list)
    kept: str | None = None
