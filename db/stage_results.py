"""The shape of ``rollouts.stage_results``: one typed record per stage, written and read as records, stored as plain
JSON.

The column holds a JSON object; these models give it types without changing it (the SQL views read it as it is).
The stages return these records, and a record is stored as ``record.as_json()`` (the keys it was given, nothing
filled in from defaults, so the JSON is what the stages always wrote); every reader goes through ``StageResults``
(``Rollout.results``, ``RolloutView.results``) instead of ``.get()`` chains. Unknown keys are kept
(``extra="allow"``), so an older row still reads and stores back unchanged. The parts of a result (prepare
reports, artifact summaries, build summaries) are in ``db.stage_reports``.

Keys of the object: ``init``, ``run``, ``postrun``, ``evaluate`` (each stage's result, present once the stage
finished), ``failure`` (the stage that failed for good, while the rollout is ERROR), ``previous_failures``
(failures a resumed rollout got past), ``interrupted_runs`` (harness launches set aside) and ``progress`` (what a
stage records while it runs, by stage name: only the run stage does, ``RunProgress``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, Strict

from db.enums import RolloutStatus
from db.stage_reports import ArtifactSummary, BuildSummary, PrepareReport, RuntimeReport, StoredRecord

# Stored as its value ("COMPLETED"), read back as the enum: the one lax field of a strict record.
Outcome = Annotated[RolloutStatus, Strict(False)]


class Failure(StoredRecord):
    """A stage that failed for good: the rollout is ERROR until a retry resumes it at that stage."""

    stage: str
    error: str = ""
    at: str | None = None


class InitResult(StoredRecord):
    """The agent's runtime started and prepared, the harness's files written; or ``deadline_expired`` while
    preparing (``error`` says where), and the run records a TIMEOUT without launching anything."""

    runtime: dict[str, Any] = Field(default_factory=dict)  # the runtime's own description (``Runtime.describe``)
    harness: str | None = None
    prepare: list[PrepareReport] = Field(default_factory=list)
    harness_files: list[str] = Field(default_factory=list)
    deadline_expired: bool = False
    error: str | None = None


class InterruptedRun(StoredRecord):
    """A harness launch cut short (its worker died or went stale) and set aside with its captures."""

    launch: int
    launch_id: str | None = None
    launched_at: str | None = None
    host: str | None = None
    set_aside_at: str | None = None
    reason: str = ""
    captures_set_aside: int = 0
    seq_end: int = 0


class Relaunch(InterruptedRun):
    """The launch set aside before the run launched the harness again (the run's ``relaunched``), and what was
    done about it: its leftover process killed, the runtime prepared again (past the deadline, perhaps)."""

    leftover_killed: bool = False
    runtime_prepared_again: bool = False
    deadline_expired: bool = False


class RunResult(StoredRecord):
    """How the harness ended. ``outcome`` is the rollout status it leads to (COMPLETED, ERROR or TIMEOUT)."""

    launched: bool = False
    recovered: bool = False  # read from the launcher's exit file after the worker that ran it died
    exit_code: int | None = None
    duration_s: float | None = None
    budget_s: float | None = None
    agent_budget_expired: bool = False  # the task's agent_timeout_s stopped it (an aligned timeout)
    deadline_expired: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    outcome: Outcome
    error: str | None = None
    infra_error: str | None = None  # the harness could not start, or an agent exited 0 without a model call
    relaunched: Relaunch | None = None  # the launch set aside before this one, and why
    artifacts: ArtifactSummary = Field(default_factory=ArtifactSummary)
    eval_runtime: RuntimeReport | None = None  # the evaluation runtime prepared while the agent ran
    interrupted: bool = False  # cut short more often than POLAR_RUN_RETRIES allows relaunching
    leftover_killed: bool = False
    relaunches: int = 0


class PostrunResult(StoredRecord):
    artifacts: ArtifactSummary = Field(default_factory=ArtifactSummary)
    build: BuildSummary = Field(default_factory=BuildSummary)


class EvaluateResult(StoredRecord):
    evaluator: str | None = None
    fresh_runtime: RuntimeReport | None = None  # the evaluation runtime it graded in
    rebuilt_runtime: RuntimeReport | None = None  # the agent's runtime, rebuilt on this host from the artifacts
    skipped: str | None = None  # why no evaluator ran (the run did not complete)
    reward: float | None = None
    duration_s: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)  # the evaluator's own, free-form
    build: BuildSummary = Field(default_factory=BuildSummary)


StageResult = InitResult | RunResult | PostrunResult | EvaluateResult

STAGE_MODELS: dict[str, type[StageResult]] = {
    "init": InitResult,
    "run": RunResult,
    "postrun": PostrunResult,
    "evaluate": EvaluateResult,
}


class LaunchedProcess(StoredRecord):
    """The harness's process (``ProcessHandle``), so a later attempt can kill a leftover one."""

    pid: int
    start_ticks: int


class RunProgress(StoredRecord):
    """What the run stage records while the harness runs: the launch (before it starts), its process (once it
    is spawned) and how it ended (as soon as it has, before anything else can fail)."""

    launched_at: str | None = None
    budget_s: float | None = None
    launch_id: str | None = None
    host: str | None = None
    process: LaunchedProcess | None = None
    ended: RunResult | None = None

    @property
    def launched(self) -> datetime | None:
        return datetime.fromisoformat(self.launched_at) if self.launched_at else None


class Progress(StoredRecord):
    """``stage_results["progress"]``, by stage name."""

    run: RunProgress | None = None

    def without(self, stages: Collection[str]) -> dict[str, Any]:
        """The progress as stored, less that of ``stages``."""
        return {name: value for name, value in self.as_json().items() if name not in stages}


class StageResults(StoredRecord):
    init: InitResult | None = None
    run: RunResult | None = None
    postrun: PostrunResult | None = None
    evaluate: EvaluateResult | None = None
    failure: Failure | None = None
    previous_failures: list[Failure] = Field(default_factory=list)
    interrupted_runs: list[InterruptedRun] = Field(default_factory=list)
    progress: Progress = Field(default_factory=Progress)

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> StageResults:
        return cls.model_validate(stored or {})

    def stage(self, name: str) -> StageResult | None:
        """Stage ``name``'s result, once it finished."""
        return {"init": self.init, "run": self.run, "postrun": self.postrun, "evaluate": self.evaluate}[name]

    @property
    def run_progress(self) -> RunProgress:
        """What the run stage recorded so far (empty before it launched anything)."""
        return self.progress.run or RunProgress()


def checked_stage_result(stage: str, result: StageResult) -> dict[str, Any]:
    """``result`` as it will be stored, once it checked as ``stage``'s record (a ``TypeError`` for another
    stage's, a ``ValidationError`` for one that would not read back: a bug, caught before the row is written)."""
    model = STAGE_MODELS[stage]
    if not isinstance(result, model):
        raise TypeError(f"the {stage} stage returned a {type(result).__name__}, not a {model.__name__}")
    stored = result.as_json()
    model.model_validate(stored)
    return stored
