"""The pipeline without Prefect: a batch end to end on SQLite and Postgres, and the injected faults (a flaky
prepare action, a harness that crashes mid-run, a harness past its budget or the deadline, a run cut short
by a dead flow (launched again, or not: past the relaunch limit), two owners racing for one rollout, a runtime
that vanished)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import openai
import pytest
import sqlalchemy as sa

from db.enums import CaptureStatus, RolloutStatus, TaskStatus
from db.models import Rollout, Task
from db.stage_results import RunProgress, RunResult
from polar.errors import RolloutClaimed
from polar.rollout import (
    ProcessLimiter,
    drive_rollout,
    drive_rollouts,
    process_limiter,
    state,
    submit_tasks,
)
from polar.rollout.stages import init as init_stage
from polar.rollout.state import Stage
from polar.runtime import bwrap_available
from tests.rollout.helpers import (
    GIT_INIT,
    SOLVE,
    answer_task,
    captures,
    evaluations,
    rollout_row,
    script,
    trajectories,
)

# Seeded: a free sample of the random tiny model can hold a malformed tool call (reward 0 by the filter).
ASK_ONCE = (
    "import os, openai\n"
    "client = openai.OpenAI()\n"
    "question = open(os.environ['POLAR_INSTRUCTION_FILE']).read()\n"
    "reply = client.chat.completions.create(model=os.environ['POLAR_MODEL'], max_tokens=8, seed=7,\n"
    "    messages=[{'role': 'user', 'content': question}])\n"
    "open('answer.txt', 'w').write('polar')\n"
)


async def run_tasks(ctx, tasks, *, limiter=None):
    submitted = submit_tasks(ctx.factory, tasks)
    ids = [rid for task in submitted for rid in task.rollout_ids]
    results = await drive_rollouts(ctx, ids, "test", limiter=limiter or process_limiter(ctx.settings))
    return submitted, ids, results


async def test_a_batch_produces_rollouts_captures_trajectories_and_rewards(store_context):
    ctx = store_context
    command_task = answer_task(
        name="command",
        samples=1,
        policies=None,  # the local model samples freely
        harness={"name": "command", "config": {"command": ["{python}", "-c", ASK_ONCE]}},
    )
    command_task.pop("policies")
    submitted, ids, results = await run_tasks(ctx, [answer_task(samples=2), command_task])
    assert not [r for r in results if isinstance(r, BaseException)]
    rows = [rollout_row(ctx.factory, rid) for rid in ids]
    assert [r.status for r in rows] == [RolloutStatus.COMPLETED] * 3
    assert [r.reward for r in rows] == [1.0, 0.0, 1.0]
    for row in rows:
        assert row.stage == "evaluate" and row.attempt == 1 and row.finished_at is not None
        assert set(row.stage_timings) == {"init", "run", "postrun", "evaluate"}
        assert all(t["attempts"] == 1 and t["duration_s"] >= 0 for t in row.stage_timings.values())
        assert row.weight_version_min == row.weight_version_max == "default"
        built = trajectories(ctx.factory, row.id)
        assert len(built) == 1
        if row.id == ids[2]:  # sampled by the local model: trains with its reward
            assert built[0].n_loss_tokens > 0 and built[0].reward == row.reward and not built[0].scripted
            assert built[0].n_malformed_tool_calls == 0
        else:  # scripted replies never train, whatever their reward
            assert built[0].scripted and built[0].n_loss_tokens == 0 and built[0].filter_reason == "scripted"
        assert [e.reward for e in evaluations(ctx.factory, row.id)] == [row.reward]
    # The built-in agent: two scripted calls merged into one trajectory; the diff is kept.
    assert len(captures(ctx.factory, ids[0])) == 2
    assert rows[0].stage_results["postrun"]["artifacts"]["changed"] == ["answer.txt"]
    assert "+polar" in rows[0].stage_results["postrun"]["artifacts"]["diff"]
    # The command harness: one freely sampled call through the OpenAI SDK.
    assert [c.backend for c in captures(ctx.factory, ids[2])] == ["local"]
    with ctx.factory() as db:
        assert {db.get(Task, t.task_id).status for t in submitted} == {TaskStatus.COMPLETED}
    # The runtimes are gone (POLAR_KEEP_WORKDIRS is off).
    assert not any((ctx.settings.runtime_dir / rid).exists() for rid in ids)


async def test_a_prepare_action_that_fails_once_is_retried(context):
    flaky = {
        "command": "if [ ! -f ../.tried ]; then touch ../.tried; exit 1; fi",
        "max_attempts": 2,
        "retry_backoff_s": 0,
    }
    _, ids, _ = await run_tasks(context, [answer_task(samples=1, runtime={"prepare": [flaky, {"command": GIT_INIT}]})])
    row = rollout_row(context.factory, ids[0])
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0
    report = row.stage_results["init"]["prepare"][0]
    assert report["attempts"] == 2 and len(report["errors"]) == 1 and "exit code 1" in report["errors"][0]
    assert row.stage_timings["init"]["attempts"] == 1  # the action retried, not the stage


async def test_a_prepare_action_that_always_fails_fails_init(context):
    broken = {"command": "echo no network >&2; exit 7", "max_attempts": 2, "retry_backoff_s": 0}
    _, ids, results = await run_tasks(context, [answer_task(samples=1, runtime={"prepare": [broken]})])
    assert isinstance(results[0], Exception)
    row = rollout_row(context.factory, ids[0])
    assert row.status is RolloutStatus.ERROR and row.stage_results["failure"]["stage"] == "init"
    assert "failed 2 time(s)" in row.error and "no network" in row.error


async def test_a_harness_crash_mid_run_is_an_error_that_keeps_its_captures_masked(context):
    crash = script("echo started > log.txt", "kill -9 $PPID")
    _, ids, results = await run_tasks(context, [answer_task(samples=1, policies=[crash])])
    assert not isinstance(results[0], BaseException)  # a crash is an outcome, not a pipeline failure
    row = rollout_row(context.factory, ids[0])
    assert row.status is RolloutStatus.ERROR and row.reward == 0.0
    # Killed by SIGKILL: -9 on the host; under bubblewrap (the default where it works) 128 + 9, as docker says it.
    assert any(f"exited with code {code}" in row.error for code in (-9, 137)) and "failure" not in row.stage_results
    assert len(captures(context.factory, ids[0])) == 2  # both calls made before the crash
    built = trajectories(context.factory, ids[0])
    assert built and all(t.n_loss_tokens == 0 and set(t.loss_mask) == {0} for t in built)
    assert {t.filter_reason for t in built} == {"rollout_error"} and {t.reward for t in built} == {0.0}
    assert evaluations(context.factory, ids[0]) == []  # an errored run is not evaluated
    assert row.stage_results["evaluate"]["skipped"].startswith("the run ended ERROR")


@pytest.mark.parametrize(("work", "reward"), [("echo partial > log.txt", 0.0), ("echo polar > answer.txt", 1.0)])
async def test_a_harness_past_its_agent_budget_is_verified_on_the_state_it_left(context, work, reward):
    """As Harbor does: the agent is stopped at its budget and the verifier scores what it left; the reward stands,
    the TIMEOUT beside it (an agent that had written the answer scores 1)."""
    slow = script(work, "sleep 30")
    _, ids, _ = await run_tasks(context, [answer_task(samples=1, policies=[slow], agent_timeout_s=4)])
    row = rollout_row(context.factory, ids[0])
    run = row.stage_results["run"]
    assert row.status is RolloutStatus.TIMEOUT and run["agent_budget_expired"] and not run["deadline_expired"]
    assert run["budget_s"] == 4 and run["duration_s"] < 10
    assert row.reward == reward and [e.reward for e in evaluations(context.factory, ids[0])] == [reward]
    assert len(captures(context.factory, ids[0])) == 2
    built = trajectories(context.factory, ids[0])
    # An agent-budget timeout trains with the verifier's reward (mask kept; tests/trajectory checks that rule), but
    # these replies were scripted, and scripted replies never train.
    assert built and all(t.n_loss_tokens == 0 and t.reward == reward and t.filter_reason == "scripted" for t in built)


async def test_a_harness_past_the_deadline_times_out_masked(context):
    slow = script("echo partial > log.txt", "sleep 30")
    _, ids, _ = await run_tasks(context, [answer_task(samples=1, policies=[slow], timeout_s=5)])
    row = rollout_row(context.factory, ids[0])
    assert row.status is RolloutStatus.TIMEOUT and row.stage_results["run"]["deadline_expired"]
    built = trajectories(context.factory, ids[0])
    assert built and all(t.n_loss_tokens == 0 and t.filter_reason == "rollout_timeout" for t in built)
    assert len(captures(context.factory, ids[0])) >= 1


def _cut_short_launch(context, rollout_id: str) -> None:
    """A dead flow's run stage: init done, the harness launched (recorded), then the flow died; its heartbeat goes
    stale, so another flow may take the rollout over."""
    state.begin_stage(context.factory, rollout_id, Stage.RUN, "dead-flow", default_timeout_s=60)
    launched = RunProgress(launched_at=state.now().isoformat(), launch_id="dead-launch")
    state.record_progress(context.factory, rollout_id, "dead-flow", launched)


def _stale(context, rollout_id: str) -> None:
    with context.factory() as db, db.begin():
        db.execute(
            sa.update(Rollout).where(Rollout.id == rollout_id).values(heartbeat_at=state.now() - timedelta(hours=1))
        )


async def test_a_run_cut_short_by_a_dead_flow_is_launched_again_with_a_fresh_session(context):
    (rollout_id,) = submit_tasks(context.factory, [answer_task(samples=1, policies=[SOLVE])])[0].rollout_ids
    state.claim(context.factory, rollout_id, "dead-flow", default_timeout_s=60, stale_after_s=600)
    await init_stage(context, rollout_id, owner="dead-flow")
    _cut_short_launch(context, rollout_id)
    # The dead launch's harness made one call (the script's first step) and left a file behind.
    access = await context.gateway.open_session(rollout_id, policy=SOLVE)
    client = openai.AsyncOpenAI(base_url=access.base_urls["openai"], api_key=access.api_key, max_retries=0)
    tools: list = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    await client.chat.completions.create(
        model="polar",
        messages=[{"role": "user", "content": "Go."}],
        tools=tools,
        max_tokens=32,  # type: ignore[list-item]
    )
    await client.close()
    (context.settings.runtime_root / rollout_id / "work" / "left-behind.txt").write_text("x")
    (old,) = captures(context.factory, rollout_id)
    _stale(context, rollout_id)

    summary = await drive_rollout(context, rollout_id, "second-flow", limiter=process_limiter(context.settings))
    row = rollout_row(context.factory, rollout_id)
    # Launched again from the start of the script (a new history), in a runtime prepared afresh: the real reward.
    assert summary.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
    relaunched = row.stage_results["run"]["relaunched"]
    assert relaunched["launch"] == 1 and relaunched["launch_id"] == "dead-launch" and relaunched["reason"]
    assert relaunched["captures_set_aside"] == 1 and relaunched["seq_end"] == 1 and relaunched["runtime_prepared_again"]
    (record,) = row.stage_results["interrupted_runs"]  # kept where a later stage or retry still sees it
    assert record["launch_id"] == "dead-launch" and record["captures_set_aside"] == 1
    assert not (context.settings.runtime_root / rollout_id / "work" / "left-behind.txt").exists()
    calls = captures(context.factory, rollout_id)
    assert calls[0].id == old.id and calls[0].status is CaptureStatus.INTERRUPTED and "launch 1" in calls[0].error
    assert len(calls) >= 3 and all(c.status is CaptureStatus.OK for c in calls[1:])
    built = trajectories(context.factory, rollout_id)
    assert built and all(old.id not in t.capture_ids for t in built)  # never trained, never merged
    assert sorted(i for t in built for i in t.capture_ids) == [c.id for c in calls[1:]]


async def test_a_run_cut_short_past_the_relaunch_limit_ends_interrupted(context):
    (rollout_id,) = submit_tasks(context.factory, [answer_task(samples=1)])[0].rollout_ids
    state.claim(context.factory, rollout_id, "dead-flow", default_timeout_s=60, stale_after_s=600)
    await init_stage(context, rollout_id, owner="dead-flow")
    _cut_short_launch(context, rollout_id)
    with context.factory() as db, db.begin():  # one relaunch already made: POLAR_RUN_RETRIES (1) allows no more
        row = db.get(Rollout, rollout_id)
        assert row is not None
        row.stage_results = {**row.stage_results, "interrupted_runs": [{"launch": 1}]}
    _stale(context, rollout_id)
    summary = await drive_rollout(context, rollout_id, "second-flow", limiter=process_limiter(context.settings))
    row = rollout_row(context.factory, rollout_id)
    assert summary.status is RolloutStatus.ERROR and row.stage_results["run"]["interrupted"]
    assert row.stage_results["run"]["relaunches"] == 1 and "POLAR_RUN_RETRIES (1)" in row.error
    assert row.stage_timings["init"]["attempts"] == 1 and row.attempt == 2
    assert captures(context.factory, rollout_id) == []  # nothing was launched again


async def test_a_run_retried_after_its_harness_ended_reports_that_end(context):
    submitted = submit_tasks(context.factory, [answer_task(samples=1)])
    rollout_id = submitted[0].rollout_ids[0]
    state.claim(context.factory, rollout_id, "flow", default_timeout_s=60, stale_after_s=600)
    await init_stage(context, rollout_id, owner="flow")
    state.begin_stage(context.factory, rollout_id, Stage.RUN, "flow", default_timeout_s=60)
    ended = {"launched": True, "exit_code": 0, "outcome": "COMPLETED", "agent_budget_expired": False}
    # The harness ended and was recorded; then the stage failed (say, closing the session) and is retried.
    recorded = RunProgress(launched_at=state.now().isoformat(), ended=RunResult.model_validate(ended))
    state.record_progress(context.factory, rollout_id, "flow", recorded)
    summary = await drive_rollout(context, rollout_id, "flow", limiter=process_limiter(context.settings))
    row = rollout_row(context.factory, rollout_id)
    assert row.stage_results["run"] == ended and row.stage_timings["run"]["attempts"] == 2
    assert summary.status is RolloutStatus.COMPLETED and captures(context.factory, rollout_id) == []  # not relaunched


async def test_two_owners_never_run_one_rollout(context):
    submitted = submit_tasks(context.factory, [answer_task(samples=1)])
    rollout_id = submitted[0].rollout_ids[0]
    limiter = process_limiter(context.settings)
    results = await asyncio.gather(
        drive_rollout(context, rollout_id, "flow-a", limiter=limiter),
        drive_rollout(context, rollout_id, "flow-b", limiter=limiter),
        return_exceptions=True,
    )
    assert sum(isinstance(r, RolloutClaimed) for r in results) == 1
    row = rollout_row(context.factory, rollout_id)
    assert row.status is RolloutStatus.COMPLETED and row.attempt == 1
    assert len(captures(context.factory, rollout_id)) == 2
    # Running it again is a no-op: it is finished.
    again = await drive_rollout(context, rollout_id, "flow-c", limiter=limiter)
    assert again.status is RolloutStatus.COMPLETED and rollout_row(context.factory, rollout_id).attempt == 1


async def test_a_resumed_rollout_whose_runtime_is_gone_initialises_again(context):
    submitted = submit_tasks(context.factory, [answer_task(samples=1)])
    rollout_id = submitted[0].rollout_ids[0]
    state.claim(context.factory, rollout_id, "other-machine", default_timeout_s=60, stale_after_s=600)
    await init_stage(context, rollout_id, owner="other-machine")
    import shutil

    shutil.rmtree(context.settings.runtime_dir / rollout_id)
    summary = await drive_rollout(
        context, rollout_id, "this-machine", limiter=process_limiter(context.settings), takeover=True, stale_after_s=0
    )
    assert summary.status is RolloutStatus.COMPLETED and summary.reward == 1.0
    assert rollout_row(context.factory, rollout_id).stage_timings["init"]["attempts"] == 1  # re-run from scratch


async def test_stage_limits_bound_how_many_harnesses_run_at_once(context):
    limiter = ProcessLimiter({"ready": 2, "init": 1, "run": 1, "postrun": 1})
    _, ids, _ = await run_tasks(context, [answer_task(samples=3)], limiter=limiter)
    spans = []
    for rid in ids:
        timing = rollout_row(context.factory, rid).stage_timings["run"]
        spans.append((timing["started_at"], timing["finished_at"]))
    spans.sort()
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans))


async def test_evaluation_in_a_fresh_runtime_prepared_while_the_agent_runs(context):
    bug = {"type": "write_file", "path": "calc.py", "content": "def add(a, b):\n    return a - b\n"}
    task = answer_task(
        samples=2,
        policies=[script("sed -i 's/a - b/a + b/' calc.py"), script("echo '# looked' >> calc.py")],
        runtime={"prepare": [bug, {"command": GIT_INIT}]},
        evaluator={
            "type": "tests",
            "fresh_runtime": True,
            "config": {
                "command": "{python} -m pytest -q -p no:cacheprovider",
                "files": {"test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
            },
        },
    )
    _, ids, _ = await run_tasks(context, [task])
    solved, unsolved = (rollout_row(context.factory, rid) for rid in ids)
    assert (solved.reward, unsolved.reward) == (1.0, 0.0)
    assert solved.stage_results["run"]["eval_runtime"]["prepare"]  # prepared during the run
    fresh = solved.stage_results["evaluate"]["fresh_runtime"]
    assert fresh["reused"] and fresh["applied_diff"]


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) is not installed")
async def test_the_agent_runs_inside_bubblewrap(context):
    probe = script("touch /usr/polar-probe-$$ 2>/dev/null && echo escaped > answer.txt || echo polar > answer.txt")
    _, ids, _ = await run_tasks(
        context,
        [answer_task(samples=1, policies=[probe], runtime={"isolation": "bwrap", "prepare": [{"command": GIT_INIT}]})],
    )
    row = rollout_row(context.factory, ids[0])
    assert row.stage_results["init"]["runtime"]["isolation"] == "bwrap"
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0  # the host stayed read-only
    assert len(captures(context.factory, ids[0])) == 2  # and the gateway on loopback was reachable
