"""The shape of ``rollouts.stage_results``: one typed record per stage, read as attributes, stored as plain JSON.

The column holds a JSON object; these models give it types without changing it (the SQL views read it as it is):
a stage's result is stored as the stage returned it, after it validated against its model here, and every reader
goes through ``StageResults`` (``Rollout.results``) instead of ``.get()`` chains. Unknown keys are kept
(``extra="allow"``), so a stage may record more than its model names, and an older row still reads.

Keys of the object: ``init``, ``run``, ``postrun``, ``evaluate`` (each stage's result, present once the stage
finished), ``failure`` (the stage that failed for good, while the rollout is ERROR), ``previous_failures``
(failures a resumed rollout got past), ``interrupted_runs`` (harness launches set aside) and ``progress`` (what a
stage records while it runs, by stage name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    # strict: a stored "yes" is not a bool, and a number stored as a string is not a number (no guessing)
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)


class Failure(_Record):
    """A stage that failed for good: the rollout is ERROR until a retry resumes it at that stage."""

    stage: str
    error: str = ""
    at: str | None = None


class InitResult(_Record):
    runtime: dict[str, Any] = Field(default_factory=dict)
    harness: str | None = None
    harness_files: list[str] = Field(default_factory=list)
    deadline_expired: bool = False
    error: str | None = None


class RunResult(_Record):
    """How the harness ended. ``outcome`` is the rollout status it leads to (COMPLETED, ERROR or TIMEOUT)."""

    outcome: str
    launched: bool = False
    recovered: bool = False  # read from the launcher's exit file after the worker that ran it died
    exit_code: int | None = None
    duration_s: float | None = None
    budget_s: float | None = None
    agent_budget_expired: bool = False  # the task's agent_timeout_s stopped it (an aligned timeout)
    deadline_expired: bool = False
    error: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    artifacts: dict[str, Any] = Field(default_factory=dict)
    relaunched: dict[str, Any] | None = None  # the launch set aside before this one, and why


class PostrunResult(_Record):
    artifacts: dict[str, Any] = Field(default_factory=dict)
    build: dict[str, Any] = Field(default_factory=dict)


class EvaluateResult(_Record):
    evaluator: str | None = None
    reward: float | None = None
    duration_s: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    skipped: str | None = None  # why no evaluator ran (the run did not complete)
    build: dict[str, Any] = Field(default_factory=dict)


class InterruptedRun(_Record):
    """A harness launch cut short (its worker died or went stale) and set aside with its captures."""

    launch: int
    launch_id: str | None = None
    launched_at: str | None = None
    host: str | None = None
    set_aside_at: str | None = None
    reason: str = ""
    captures_set_aside: int = 0
    seq_end: int = 0


STAGE_MODELS: dict[str, type[_Record]] = {
    "init": InitResult,
    "run": RunResult,
    "postrun": PostrunResult,
    "evaluate": EvaluateResult,
}


class StageResults(_Record):
    init: InitResult | None = None
    run: RunResult | None = None
    postrun: PostrunResult | None = None
    evaluate: EvaluateResult | None = None
    failure: Failure | None = None
    previous_failures: list[Failure] = Field(default_factory=list)
    interrupted_runs: list[InterruptedRun] = Field(default_factory=list)
    progress: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> StageResults:
        return cls.model_validate(stored or {})

    def progress_of(self, stage: str) -> Mapping[str, Any]:
        return self.progress.get(stage) or {}


def checked_stage_result(stage: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """``result`` as it will be stored, once it validated against ``stage``'s model (``ValidationError``
    otherwise: a stage that returns a malformed result is a bug, caught before the row is written)."""
    STAGE_MODELS[stage].model_validate(result)
    return dict(result)
