"""``rollouts.stage_results`` read through typed records: the same JSON, attributes instead of ``.get()`` chains."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from db.stage_results import StageResults, checked_stage_result


def test_a_stored_row_reads_as_attributes_and_keeps_what_its_model_does_not_name():
    stored = {
        "run": {"outcome": "TIMEOUT", "agent_budget_expired": True, "exit_code": -9, "eval_runtime": {"x": 1}},
        "failure": {"stage": "postrun", "error": "boom", "at": "2026-12-05T00:00:00+00:00"},
        "previous_failures": [{"stage": "init", "error": "no image"}],
        "interrupted_runs": [{"launch": 1, "reason": "worker died", "captures_set_aside": 3}],
        "progress": {"run": {"launched_at": "2026-12-05T00:00:00+00:00"}},
    }
    results = StageResults.of(stage_results := stored)
    assert results.run is not None and results.run.agent_budget_expired and results.run.exit_code == -9
    assert results.run.model_extra == {"eval_runtime": {"x": 1}}  # a stage may record more than its model names
    assert results.failure is not None and results.failure.stage == "postrun"
    assert [f.stage for f in results.previous_failures] == ["init"]
    assert results.interrupted_runs[0].captures_set_aside == 3
    assert results.progress_of("run")["launched_at"].startswith("2026")
    assert results.init is None and results.progress_of("init") == {}
    assert StageResults.of(None) == StageResults()
    assert stage_results is stored  # reading never rewrites the column


def test_a_malformed_stage_result_is_refused_before_it_is_written():
    assert checked_stage_result("run", {"outcome": "COMPLETED", "exit_code": 0}) == {
        "outcome": "COMPLETED",
        "exit_code": 0,
    }
    for stage, bad in (
        ("run", {"exit_code": 0}),  # no outcome
        ("run", {"outcome": "COMPLETED", "agent_budget_expired": "yes"}),  # not coerced to True
        ("evaluate", {"reward": "1.0"}),  # a number stored as a string
        ("init", {"harness_files": "a.txt"}),
    ):
        with pytest.raises(ValidationError):
            checked_stage_result(stage, bad)
