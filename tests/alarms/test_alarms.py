"""Each alarm kind fired by a real batch (the built-in agent on scripted replies through a live gateway on the
local model, a ``command`` harness that exits without calling the model, an evaluator that always fails) and
none by a healthy batch; each alarm counted in ``/metrics`` and posted to its tasks' webhooks."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

import pytest
from fastapi import FastAPI, Request
from prometheus_client import REGISTRY

from polar.alarms import AlarmKind, batch_alarms, count_alarms, notify_webhooks
from polar.alarms.checks import evaluate, outcomes
from polar.rollout import drive_rollouts, process_limiter, submit_tasks
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import FAIL, SOLVE, answer_task

SILENT_HARNESS = {"name": "command", "config": {"command": "echo I quit"}}  # exits 0, never calls the model
BROKEN_EVALUATOR = {"type": "script", "config": {"script": "echo scorer down >&2; exit 3"}}


def run_batch(context, tasks) -> list[str]:
    submitted = submit_tasks(context.factory, tasks)
    ids = [rid for task in submitted for rid in task.rollout_ids]

    async def run() -> None:
        await drive_rollouts(context, ids, "alarm-test", limiter=process_limiter(context.settings))

    with ThreadPoolExecutor(1) as pool:  # a loop of its own: fixtures may be set up inside pytest-asyncio's
        pool.submit(asyncio.run, run()).result()
    return ids


def alarms_of(context, ids, **thresholds):
    settings = context.settings.model_copy(update={"alarm_min_groups": 2, "alarm_min_rollouts": 2, **thresholds})
    with context.factory() as db:
        return batch_alarms(db, settings, ids)


def kinds(alarms) -> set[AlarmKind]:
    return {alarm.kind for alarm in alarms}


def counted(kind: AlarmKind) -> float:
    return REGISTRY.get_sample_value("polar_alarms_total", {"kind": kind.value}) or 0.0


@pytest.fixture(scope="module")
def healthy(context) -> list[str]:
    return run_batch(context, [answer_task(name=f"healthy-{i}", samples=2, policies=[SOLVE, FAIL]) for i in range(3)])


def test_a_healthy_batch_raises_no_alarm(context, healthy):
    assert alarms_of(context, healthy) == []


def test_rewards_all_one_over_enough_groups(context, healthy):
    solved = run_batch(context, [answer_task(name=f"easy-{i}", samples=2, policies=[SOLVE]) for i in range(2)])
    (alarm,) = alarms_of(context, solved)
    assert alarm.kind is AlarmKind.ALL_ONE_REWARD and alarm.value == 2 and len(alarm.task_ids) == 2
    assert "all 4 rewards over 2 groups are 1" in alarm.message
    assert alarms_of(context, solved, alarm_min_groups=3) == []  # too few groups to say
    assert alarms_of(context, [*solved, *healthy]) == []  # mixed with groups that fail: nothing


def test_a_harness_that_never_calls_the_model(context):
    ids = run_batch(context, [answer_task(name=f"quits-{i}", samples=2, harness=SILENT_HARNESS) for i in range(2)])
    alarms = {alarm.kind: alarm for alarm in alarms_of(context, ids)}
    assert set(alarms) == {AlarmKind.NO_MODEL_CALL, AlarmKind.EMPTY_PATCHES, AlarmKind.ALL_ZERO_REWARD}
    assert alarms[AlarmKind.NO_MODEL_CALL].value == 1.0  # every run, none over the gateway
    assert (
        "4 of the last 4 harness runs made no model call (100%, up from 0%" in alarms[AlarmKind.NO_MODEL_CALL].message
    )
    assert "4 of the last 4 git rollouts changed nothing" in alarms[AlarmKind.EMPTY_PATCHES].message
    assert "all 4 rewards over 2 groups are 0" in alarms[AlarmKind.ALL_ZERO_REWARD].message


def test_a_share_that_rises_after_a_healthy_start_fires_and_a_steady_one_does_not(context, healthy):
    ids = run_batch(context, [answer_task(name=f"stops-{i}", samples=2, harness=SILENT_HARNESS) for i in range(2)])
    rising = {a.kind: a for a in alarms_of(context, [*healthy, *ids], alarm_rising_recent=4)}
    assert "4 of the last 4 harness runs made no model call (100%, up from 0% over the 6 before)" in (
        rising[AlarmKind.NO_MODEL_CALL].message
    )
    # The same rollouts with the silent ones first: the recent window is healthy, the share fell.
    with context.factory() as db:
        items = outcomes(db, rollout_ids=[*healthy, *ids])
    early = min(o.finished_at for o in items if o.finished_at) - timedelta(hours=1)
    flipped = [replace(o, finished_at=early) if o.rollout_id in ids else o for o in items]
    settings = context.settings.model_copy(update={"alarm_min_groups": 2, "alarm_min_rollouts": 2})
    assert AlarmKind.NO_MODEL_CALL not in kinds(
        evaluate(flipped, settings.model_copy(update={"alarm_rising_recent": 4}))
    )
    # A steady share: silent runs spread over the batch (2 of the 6 before, 2 of the last 4): 50% is over the
    # floor, but not twice the baseline's 33%, so no alarm (a fixed threshold would have fired).
    silent = [o for o in items if o.rollout_id in ids]
    working = [o for o in items if o.rollout_id not in ids]
    assert len(silent) == 4 and len(working) == 6
    order = [working[0], silent[0], working[1], working[2], silent[1], working[3], silent[2], working[4], silent[3]]
    order += [working[5]]
    spaced = [replace(o, finished_at=early + timedelta(seconds=i)) for i, o in enumerate(order)]
    assert AlarmKind.NO_MODEL_CALL not in kinds(
        evaluate(spaced, settings.model_copy(update={"alarm_rising_recent": 4}))
    )


def test_an_evaluator_that_always_fails_is_an_infrastructure_error(context, healthy):
    ids = run_batch(context, [answer_task(name="unscored", samples=2, evaluator=BROKEN_EVALUATOR)])
    (alarm,) = alarms_of(context, ids)
    assert alarm.kind is AlarmKind.INFRA_ERRORS and alarm.value == 1.0
    assert "2 of 2 rollouts failed in a pipeline stage" in alarm.message
    # Diluted by the healthy batch (2 of 8 = 25%): under a 30% threshold, over a 20% one.
    assert alarms_of(context, [*ids, *healthy], alarm_infra_error_share=0.3) == []
    assert kinds(alarms_of(context, [*ids, *healthy], alarm_infra_error_share=0.2)) == {AlarmKind.INFRA_ERRORS}


def test_alarms_are_counted_and_posted_to_the_tasks_webhooks(context):
    received: list[tuple[str, dict]] = []
    hook = FastAPI()

    @hook.post("/hook")
    async def collect(request: Request) -> dict:
        received.append((request.headers.get("x-polar-event", ""), await request.json()))
        return {}

    with ServerThread(hook) as server:
        tasks = [
            answer_task(name=f"hooked-{i}", samples=2, harness=SILENT_HARNESS, callback_url=f"{server.url}/hook")
            for i in range(2)
        ]
        ids = run_batch(context, tasks)
        alarms = alarms_of(context, ids)
        before = {kind: counted(kind) for kind in AlarmKind}
        count_alarms(alarms)
        assert {k: counted(k) - before[k] for k in AlarmKind if counted(k) != before[k]} == {
            AlarmKind.NO_MODEL_CALL: 1,
            AlarmKind.EMPTY_PATCHES: 1,
            AlarmKind.ALL_ZERO_REWARD: 1,
        }
        count_alarms(alarms, once=True)  # the live view's way: counted already, not again
        assert counted(AlarmKind.NO_MODEL_CALL) - before[AlarmKind.NO_MODEL_CALL] == 1
        assert notify_webhooks(context.factory, alarms) == 6  # three alarms, each about both tasks
    assert {event for event, _ in received} == {"alarm"}
    assert sorted((body["kind"], body["task_id"]) for _, body in received) == sorted(
        (alarm.kind.value, task_id) for alarm in alarms for task_id in alarm.task_ids
    )
