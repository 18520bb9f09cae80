"""Artifacts any host can read: a rollout whose run happened on another host (its runtime folder is not here)
is evaluated from the artifacts its run kept, in the store or under POLAR_ARTIFACT_URL, with the reward its
evaluator gives; a needed artifact that was not kept is an ERROR naming it, never a reward."""

from __future__ import annotations

import dataclasses
import shutil

import sqlalchemy as sa

from db.enums import RolloutStatus
from db.models import Rollout, RolloutArtifact
from polar.rollout import drive_rollout, process_limiter, state, submit_tasks
from polar.rollout.stages import init as init_stage
from polar.rollout.stages import run as run_stage
from polar.rollout.state import Stage
from tests.rollout.helpers import answer_task, rollout_row


async def _ran_elsewhere(ctx, task) -> str:
    """A rollout whose init and run happened on 'host-a', whose runtime folder is then gone from this host."""
    (rid,) = submit_tasks(ctx.factory, [task])[0].rollout_ids
    state.claim(ctx.factory, rid, "host-a", default_timeout_s=60, stale_after_s=600)
    await init_stage(ctx, rid, owner="host-a")
    await run_stage(ctx, rid, owner="host-a")
    state.mark_failed(ctx.factory, rid, Stage.POSTRUN, "host-a", "its worker died")  # host-a gives it up
    shutil.rmtree(ctx.settings.runtime_dir / rid)
    return rid


async def _resume_here(ctx, rid: str):
    try:
        return await drive_rollout(ctx, rid, "host-b", limiter=process_limiter(ctx.settings))
    except Exception as exc:  # noqa: BLE001 - a failed stage re-raises; the row says what happened
        return exc


def _stored(ctx, rid: str) -> dict[str, RolloutArtifact]:
    with ctx.factory() as db:
        return {a.name: a for a in db.scalars(sa.select(RolloutArtifact).where(RolloutArtifact.rollout_id == rid))}


async def test_postrun_and_evaluate_on_another_host_use_the_kept_artifacts(context):
    rid = await _ran_elsewhere(context, answer_task(samples=1))
    assert {"diff.patch", "logs/harness.stdout", "logs/harness.stderr"} <= set(_stored(context, rid))
    summary = await _resume_here(context, rid)
    row = rollout_row(context.factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
    rebuilt = row.stage_results["evaluate"]["rebuilt_runtime"]
    assert rebuilt["rebuilt"] and rebuilt["applied_diff"] and rebuilt["from_artifacts"]
    assert summary.reward == 1.0


async def test_a_fresh_runtime_evaluator_on_another_host_gets_the_diff_and_copy_paths(context):
    evaluator = {
        "type": "file",
        "fresh_runtime": True,
        "copy_paths": ["notes.txt", "missing.txt"],
        "config": {"path": "notes.txt", "equals": "kept"},
    }
    policy = {
        "type": "scripted",
        "replies": [
            {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "echo kept > notes.txt"}}]},
            {"content": "Done."},
        ],
    }
    rid = await _ran_elsewhere(context, answer_task(samples=1, policies=[policy], evaluator=evaluator))
    assert "work/notes.txt" in _stored(context, rid)
    await _resume_here(context, rid)
    row = rollout_row(context.factory, rid)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
    assert row.stage_results["evaluate"]["fresh_runtime"]["from_artifacts"]


async def test_a_missing_artifact_is_an_error_naming_it_never_a_reward(context):
    # The artifacts were lost: evaluate cannot rebuild the agent's changes.
    rid = await _ran_elsewhere(context, answer_task(samples=1))
    with context.factory() as db, db.begin():
        db.execute(sa.delete(RolloutArtifact).where(RolloutArtifact.rollout_id == rid))
    await _resume_here(context, rid)
    row = rollout_row(context.factory, rid)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert "evaluate failed" in row.error and "artifact diff.patch was never stored" in row.error

    # The case that used to be a silent reward 0: the run kept nothing (an older run) and its folder is gone.
    rid = await _ran_elsewhere(context, answer_task(samples=1))
    with context.factory() as db, db.begin():
        results = dict(rollout_row(context.factory, rid).stage_results)
        results["run"] = {k: v for k, v in results["run"].items() if k != "artifacts"}
        db.execute(sa.update(Rollout).where(Rollout.id == rid).values(stage_results=results))
    await _resume_here(context, rid)
    row = rollout_row(context.factory, rid)
    assert row.status is RolloutStatus.ERROR and row.reward is None
    assert "postrun failed" in row.error and "kept no artifacts" in row.error and "diff.patch" in row.error


async def test_artifacts_under_a_shared_url_and_the_store_cap(context, tmp_path):
    shared = dataclasses.replace(
        context, settings=context.settings.model_copy(update={"artifact_url": f"file://{tmp_path / 'shared'}"})
    )
    rid = await _ran_elsewhere(shared, answer_task(samples=1))
    diff = _stored(shared, rid)["diff.patch"]
    assert diff.content is None and diff.url and (tmp_path / "shared" / rid / "diff.patch").is_file()
    await _resume_here(shared, rid)
    assert rollout_row(shared.factory, rid).reward == 1.0

    capped = dataclasses.replace(context, settings=context.settings.model_copy(update={"artifact_max_bytes": 10}))
    rid = await _ran_elsewhere(capped, answer_task(samples=1))
    assert "diff.patch" not in _stored(capped, rid)
    await _resume_here(capped, rid)
    row = rollout_row(capped.factory, rid)
    assert row.status is RolloutStatus.ERROR and "diff.patch" in row.error and "POLAR_ARTIFACT_MAX_BYTES" in row.error
