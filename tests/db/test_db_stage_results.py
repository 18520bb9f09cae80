"""``rollouts.stage_results`` read through typed records: the same JSON, attributes instead of ``.get()`` chains."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from db.enums import RolloutStatus
from db.stage_results import STAGE_MODELS, RunProgress, RunResult, StageResults, checked_stage_result
from db.stage_timings import StageHost, StageTimings


def test_a_stored_row_reads_as_attributes_and_keeps_what_its_model_does_not_name():
    stored = {
        "run": {"outcome": "TIMEOUT", "agent_budget_expired": True, "exit_code": -9, "note": {"x": 1}},
        "failure": {"stage": "postrun", "error": "boom", "at": "2026-12-05T00:00:00+00:00"},
        "previous_failures": [{"stage": "init", "error": "no image"}],
        "interrupted_runs": [{"launch": 1, "reason": "worker died", "captures_set_aside": 3}],
        "progress": {"run": {"launched_at": "2026-12-05T00:00:00+00:00"}},
    }
    results = StageResults.of(stage_results := stored)
    assert results.run is not None and results.run.agent_budget_expired and results.run.exit_code == -9
    assert results.run.outcome is RolloutStatus.TIMEOUT
    assert results.run.model_extra == {"note": {"x": 1}}  # an older row may hold more than the model names
    assert results.failure is not None and results.failure.stage == "postrun"
    assert [f.stage for f in results.previous_failures] == ["init"]
    assert results.interrupted_runs[0].captures_set_aside == 3
    assert results.run_progress.launched is not None and results.run_progress.launched.year == 2026
    assert results.init is None and StageResults().run_progress == RunProgress()
    assert results.as_json() == stored  # stored again, the row's JSON is unchanged
    assert StageResults.of(None) == StageResults()
    assert stage_results is stored  # reading never rewrites the column


def test_a_malformed_stage_result_is_refused_before_it_is_written():
    completed = RunResult(outcome=RolloutStatus.COMPLETED, exit_code=0)
    assert checked_stage_result("run", completed) == {"exit_code": 0, "outcome": "COMPLETED"}  # the keys it was given
    with pytest.raises(TypeError):
        checked_stage_result("init", completed)  # another stage's record
    for stage, bad in (
        ("run", {"exit_code": 0}),  # no outcome
        ("run", {"outcome": "DONE"}),  # not a rollout status
        ("run", {"outcome": "COMPLETED", "agent_budget_expired": "yes"}),  # not coerced to True
        ("evaluate", {"reward": "1.0"}),  # a number stored as a string
        ("init", {"harness_files": "a.txt"}),
    ):
        with pytest.raises(ValidationError):
            STAGE_MODELS[stage].model_validate(bad)


def test_stage_timings_read_typed_and_are_written_back_as_they_were():
    stored = {
        "init": {"started_at": "2026-12-05T00:00:00+00:00", "attempts": 1, "where": {"host": "h", "pid": 2, "ppid": 1}},
        "run": {"duration_s": 20.5},  # an older or hand-written row: only what it has
    }
    timings = StageTimings.of(stored)
    assert timings.started_at("init") == datetime(2026, 12, 5, tzinfo=UTC) and not timings.finished("init")
    assert timings.started_at("evaluate") is None and timings.stage("evaluate").attempts == 0
    assert timings.spent_s(("init", "run")) == 20.5 and timings.total_s == 20.5
    assert str(timings.stage("init").where) == "host=h pid=2 ppid=1"
    assert timings.as_json() == stored
    ended = timings.stage("init").ended(datetime(2026, 12, 5, 0, 0, 3, tzinfo=UTC))
    assert ended.as_json() == {**stored["init"], "finished_at": "2026-12-05T00:00:03+00:00", "duration_s": 3.0}
    again = ended.begun(datetime(2026, 12, 6, tzinfo=UTC), StageHost(host="g", pid=5, ppid=4))
    assert again.attempts == 2 and list(again.as_json()) == [
        "started_at",
        "attempts",
        "where",
        "finished_at",
        "duration_s",
    ]
