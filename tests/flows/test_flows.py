"""The Prefect flows: a batch on SQLite and on Postgres (each rollout a flow run with its four task runs), an
evaluator failure resumed by the retry flow (only evaluate runs again), and flow runs killed mid-evaluation and
mid-run, resumed without redoing finished stages or duplicating captures (a harness cut short is launched again)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from db.enums import CaptureStatus, RolloutStatus
from flows.batch import rollout_batch
from flows.retry import retry_failed
from polar.rollout.context import store_factory
from tests.flows.artifacts import PUBLIC_URL, check_artifacts
from tests.flows.conftest import wait_out_staleness
from tests.flows.prefect_api import flow_runs_named, task_runs_of
from tests.rollout.helpers import (
    answer_task,
    captures,
    rollout_row,
    script,
    trajectories,
)

STAGES = ("init", "run", "postrun", "evaluate")


def finished_at(row, stages=STAGES[:3]):
    return {stage: row.stage_timings[stage]["finished_at"] for stage in stages}


async def test_a_batch_runs_each_rollout_as_a_flow_run_with_four_task_runs(flow_env):
    flow_env(POLAR_PUBLIC_URL=PUBLIC_URL)
    summary = await rollout_batch(tasks=[answer_task(samples=2), answer_task(name="second", samples=1)])
    factory = store_factory()
    ids = [rid for rollout_ids in summary["tasks"].values() for rid in rollout_ids]
    assert summary["counts"] == {"COMPLETED": 3}
    assert summary["alarms"] == []  # a healthy batch: no alarm, no alarms artifact
    rows = {rid: rollout_row(factory, rid) for rid in ids}
    assert sorted(r.reward for r in rows.values()) == [0.0, 1.0, 1.0]
    for rid, row in rows.items():
        assert len(captures(factory, rid)) == 2 and len(trajectories(factory, rid)) == 1
        (flow_run,) = await flow_runs_named(f"rollout-{rid}")
        assert row.flow_run_id == str(flow_run.id) and flow_run.state.is_completed()
    # One rollout's task runs as the UI shows them.
    rid = ids[0]
    runs = await task_runs_of(rows[rid].flow_run_id, expect=4)
    assert [r.name for r in runs] == [f"{stage}-{rid}" for stage in STAGES]
    assert all(r.state.is_completed() for r in runs)
    # What the Prefect UI shows of the outcomes: an artifact per rollout flow run, a table on the batch.
    names = dict(zip(summary["tasks"], ["answer", "second"], strict=True))
    await check_artifacts(factory, summary, names)


async def test_an_evaluator_failure_is_retried_by_resuming_only_evaluate(flow_env, tmp_path):
    # The task's commands share a counter or gate file with the test on the host: host exec, set explicitly.
    flow_env(POLAR_EVALUATE_RETRIES="0", POLAR_RUNTIME_ISOLATION="none")
    counter = tmp_path / "evaluations"
    # The check crashes on its first run (say, its scoring service was down), then works.
    check = f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ "$n" -ge 1 ] || exit 2; echo 1'
    task = answer_task(
        samples=1,
        policies=[script("echo polar > answer.txt")],
        evaluator={"type": "script", "config": {"script": check}},
    )
    summary = await rollout_batch(tasks=[task])
    (rid,) = summary["rollouts"]
    factory = store_factory()
    failed = rollout_row(factory, rid)
    assert failed.status is RolloutStatus.ERROR and failed.stage_results["failure"]["stage"] == "evaluate"
    assert "exit code 2" in failed.error and failed.stage == "postrun"
    before, n_captures = finished_at(failed), len(captures(factory, rid))
    assert all(t.n_loss_tokens == 0 for t in trajectories(factory, rid))  # ERROR: masked until it is resumed

    result = await retry_failed(include_stale=False)
    assert result["retried"] == [rid] and result["counts"] == {"COMPLETED": 1}
    row = rollout_row(factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0 and row.error is None
    assert finished_at(row) == before  # init, run and postrun were not run again
    assert [row.stage_timings[s]["attempts"] for s in STAGES] == [1, 1, 1, 2]
    assert len(captures(factory, rid)) == n_captures
    assert [t.reward for t in trajectories(factory, rid)] == [1.0] and trajectories(factory, rid)[
        0
    ].scripted  # never trains
    assert [f["stage"] for f in row.stage_results["previous_failures"]] == ["evaluate"]
    # The retry's flow run shows the finished stages as skipped task runs.
    runs = await task_runs_of(row.flow_run_id, expect=4)
    assert [r.state.name for r in runs] == ["Skipped", "Skipped", "Skipped", "Completed"]


async def test_a_batch_whose_evaluator_always_fails_writes_an_alarm_artifact_on_its_flow_run(flow_env):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    flow_env(POLAR_EVALUATE_RETRIES="0", POLAR_ALARM_MIN_ROLLOUTS="2")
    broken = {"type": "script", "config": {"script": "echo scorer down >&2; exit 3"}}
    summary = await rollout_batch(tasks=[answer_task(name="unscored", samples=2, evaluator=broken)])
    assert summary["counts"] == {"ERROR": 2}
    (alarm,) = summary["alarms"]
    assert alarm["kind"] == "infra_errors" and alarm["value"] == 1.0
    batch_runs = {str(run.id) for run in await flow_runs_named("batch-inline")}
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["polar-alarms"]))
        )
    # The module's Prefect server is shared by both stores' runs of this test: ours is the latest.
    artifact = max((a for a in artifacts if str(a.flow_run_id) in batch_runs), key=lambda a: a.created)
    assert artifact.type == "markdown" and "infra_errors" in artifact.data
    assert "2 of 2 rollouts failed in a pipeline stage" in artifact.data


async def test_prefect_task_retries_rerun_only_the_failed_stage_within_one_flow_run(flow_env, tmp_path):
    # The task's commands share a counter or gate file with the test on the host: host exec, set explicitly.
    flow_env(POLAR_EVALUATE_RETRIES="1", POLAR_RUNTIME_ISOLATION="none")
    counter = tmp_path / "evaluations"
    check = f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ "$n" -ge 1 ] || exit 2; echo 1'
    task = answer_task(
        samples=1,
        policies=[script("echo polar > answer.txt")],
        evaluator={"type": "script", "config": {"script": check}},
    )
    summary = await rollout_batch(tasks=[task])
    (rid,) = summary["rollouts"]
    row = rollout_row(store_factory(), rid)
    assert row.status is RolloutStatus.COMPLETED and row.attempt == 1
    assert [row.stage_timings[s]["attempts"] for s in STAGES] == [1, 1, 1, 2]


def start_flow_process(rollout_id: str, api_url: str, log: Path) -> subprocess.Popen:
    code = "import asyncio, sys\nfrom flows.rollout import rollout\nasyncio.run(rollout(sys.argv[1]))\n"
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-c", code, rollout_id],
            env={**os.environ, "PREFECT_API_URL": api_url},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_flow_run_killed_during_evaluate_resumes_without_redoing_finished_stages(
    flow_env, prefect_server, tmp_path
):
    # The task's commands share a counter or gate file with the test on the host: host exec, set explicitly.
    flow_env(POLAR_RUNTIME_ISOLATION="none")
    gate = tmp_path / "hold-evaluation"
    gate.touch()
    check = f"while [ -f {gate} ]; do sleep 0.1; done; grep -qx polar answer.txt && echo 1 || echo 0"
    task = answer_task(
        samples=1,
        policies=[script("echo polar > answer.txt")],
        evaluator={"type": "script", "config": {"script": check}},
    )
    from polar.rollout import submit_tasks

    factory = store_factory()
    (rid,) = (await asyncio.to_thread(submit_tasks, factory, [task]))[0].rollout_ids
    child = start_flow_process(rid, prefect_server, tmp_path / "flow.log")
    try:
        await asyncio.to_thread(
            wait_for, lambda: rollout_row(factory, rid).status is RolloutStatus.EVALUATING, 90, "evaluate to start"
        )
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the whole flow process dies, mid-stage, with no chance to clean up
        child.wait()
    killed = rollout_row(factory, rid)
    before, n_captures, n_traj = finished_at(killed), len(captures(factory, rid)), len(trajectories(factory, rid))
    assert killed.status is RolloutStatus.EVALUATING and n_captures == 2 and n_traj == 1
    gate.unlink()

    await wait_out_staleness()  # Prefect still has the killed flow run Running
    result = await retry_failed(rollout_ids=[rid], stale_after_s=0)
    assert rid in result["retried"]
    row = rollout_row(factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0 and row.attempt == 2
    assert finished_at(row) == before
    assert [row.stage_timings[s]["attempts"] for s in STAGES] == [1, 1, 1, 2]
    assert len(captures(factory, rid)) == n_captures and len(trajectories(factory, rid)) == n_traj


async def test_a_flow_run_killed_mid_run_is_resumed_by_launching_the_harness_again(flow_env, prefect_server, tmp_path):
    # The task's commands share a counter or gate file with the test on the host: host exec, set explicitly.
    flow_env(POLAR_RUNTIME_ISOLATION="none")
    gate = tmp_path / "hold-harness"
    gate.touch()
    blocked = script(f"while [ -f {gate} ]; do sleep 0.1; done; echo polar > answer.txt")
    task = answer_task(samples=1, policies=[blocked])
    from polar.rollout import submit_tasks

    factory = store_factory()
    (rid,) = (await asyncio.to_thread(submit_tasks, factory, [task]))[0].rollout_ids
    child = start_flow_process(rid, prefect_server, tmp_path / "flow.log")
    try:
        await asyncio.to_thread(wait_for, lambda: len(captures(factory, rid)) == 1, 90, "the harness's first call")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    harness_pid = rollout_row(factory, rid).stage_results["progress"]["run"]["process"]["pid"]
    # The harness dies with its flow process (parent-death signal; the launcher kills its whole group).
    await asyncio.to_thread(wait_for, lambda: not _alive(harness_pid), 30, "the harness to die with its flow")
    (old,) = captures(factory, rid)
    gate.unlink()  # the harness launched again goes through

    await wait_out_staleness()  # Prefect still has the killed flow run Running
    result = await retry_failed(rollout_ids=[rid], stale_after_s=0)
    assert rid in result["retried"]
    row = rollout_row(factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
    relaunched = row.stage_results["run"]["relaunched"]
    assert relaunched["captures_set_aside"] == 1 and not relaunched["leftover_killed"]
    assert row.stage_timings["init"]["attempts"] == 1 and relaunched["runtime_prepared_again"]
    calls = captures(factory, rid)
    assert calls[0].id == old.id and calls[0].status is CaptureStatus.INTERRUPTED
    assert len(calls) == 3 and all(c.status is CaptureStatus.OK for c in calls[1:])
    built = trajectories(factory, rid)
    assert built and all(old.id not in t.capture_ids for t in built)  # the cut-short launch never trains
