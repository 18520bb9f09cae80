"""A rollout's progress in its row: who owns it, which stages are done, what each returned and how long it took.

The row is the authority, not Prefect's task results, so any flow run on any worker can resume a rollout.

- ``claim``: a flow run takes the rollout (``flow_run_id``), with one atomic conditional UPDATE, so two flow runs
  of one rollout never both run it. A different owner may take over only when asked to (the retry flow) or
  when the current owner's heartbeat is older than ``stale_after_s``; taking it from another owner closes
  (revokes) the rollout's gateway session in the same statement. Claiming arms the shared deadline of init
  and run: the task's ``timeout_s`` minus the time init and run already spent in earlier attempts (time spent
  waiting in between is free).
- ``begin_stage``/``finish_stage``: a stage is done once ``stage_timings[stage]["finished_at"]`` is set; its
  result (a record of ``db.stage_results``) is then ``stage_results[stage]``. A stage that is already done is
  skipped, one whose predecessor is not done is refused. ``stage_results["progress"]["run"]`` holds what the run
  stage records while it runs (``record_progress``: the harness launch, before starting it, so a resumed run
  knows a launch was cut short).
- ``set_aside``: a launch cut short (and its captures) is set aside before the harness is launched again
  (``launches``).
- ``mark_failed``: a stage failed for good; the rollout becomes ERROR with ``stage_results["failure"]`` naming
  the stage, which is what the retry flow looks for. The next ``claim`` resumes it at that stage.

Functions are synchronous (call them through ``asyncio.to_thread`` from async code) and each runs in its own
transaction. JSON columns are always reassigned, never mutated in place, so SQLAlchemy writes them; what is
written under a key is a record's ``as_json()``, what is read is the row's columns as records
(``RolloutView.results``, ``RolloutView.timings``), so the JSON keeps the shape the SQL views read. The modules:
``view`` (stages, ``RolloutView``, row lookups), ``ownership`` (claim, takeover, heartbeat, what to retry),
``stages`` (stage bookkeeping and the task status), ``launches`` (interrupted harness launches).
"""

from polar.clock import now
from polar.rollout.state.launches import calls_since_set_aside, set_aside
from polar.rollout.state.ownership import claim, heartbeat, select_retryable
from polar.rollout.state.stages import (
    StageOutput,
    StageStart,
    begin_stage,
    cancel_unstarted,
    enter_stage,
    finish_stage,
    mark_failed,
    never_started,
    record_progress,
    reopen_stage,
)
from polar.rollout.state.view import DEADLINE_STAGES, STAGES, RolloutView, Stage, load

__all__ = [
    "DEADLINE_STAGES",
    "STAGES",
    "RolloutView",
    "Stage",
    "StageOutput",
    "StageStart",
    "begin_stage",
    "calls_since_set_aside",
    "cancel_unstarted",
    "claim",
    "enter_stage",
    "finish_stage",
    "heartbeat",
    "load",
    "mark_failed",
    "never_started",
    "now",
    "record_progress",
    "reopen_stage",
    "select_retryable",
    "set_aside",
]
