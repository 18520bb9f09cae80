"""The control API as a trainer uses it, through ``polar.client``: submit, wait, query, claim, ack, callbacks,
admission control with weight versions, cancel. Tasks run inline (the embedded default) on SQLite."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from db.models import Capture, Rollout
from polar.client import ApiError, PolarClient
from polar.rollout.context import store_factory
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import answer_task


@pytest.fixture(scope="module")
def client(api) -> Iterator[PolarClient]:
    with PolarClient(api.url) as c:
        yield c


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, list[dict]]]:
    """A webhook receiver that fails its first delivery with a 500, then accepts."""
    calls: list[dict] = []
    app = FastAPI()

    @app.post("/hook")
    async def hook(request: Request) -> JSONResponse:
        calls.append({"headers": dict(request.headers), "body": await request.json()})
        return JSONResponse({}, status_code=500 if len(calls) == 1 else 200)

    with ServerThread(app) as server:
        yield server.url + "/hook", calls


def wait_for(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_submit_wait_query_claim_ack_and_callback(client, receiver):
    url, calls = receiver
    [task_id] = client.submit([answer_task(name="api-answer", callback_url=url, metadata={"group": "g1"})])
    [view] = client.wait([task_id], timeout_s=120)
    assert view["status"] == "COMPLETED" and view["counts"] == {"COMPLETED": 2}
    assert sorted(r["reward"] for r in view["rollouts"]) == [0.0, 1.0] and view["mean_reward"] == 0.5

    # The task's replies are scripted: listed only when asked for, and never trainable.
    rows = client.trajectories(task_id=task_id, include_scripted=True)
    assert len(rows) == 2 and all("response_ids" not in r for r in rows)
    assert {(r["role"], r["source_capture_id"], r["compacted"]) for r in rows} == {("main", None, False)}
    solved = client.trajectories(task_id=task_id, min_reward=1.0, tokens=True, include_scripted=True)
    assert len(solved) == 1 and len(solved[0]["response_ids"]) == len(solved[0]["loss_mask"]) > 0
    assert not any(solved[0]["loss_mask"]) and client.trajectories(task_id=task_id) == []

    batch = client.claim("trainer-a", max_groups=5)
    [group] = batch["groups"]
    assert group["task_id"] == task_id and group["metadata"] == {"group": "g1"}
    assert sorted(t["reward"] for t in group["trajectories"]) == [0.0, 1.0]
    # What a trainer weighing the stored logprobs needs: the kept chain, and each sampled span's version and regime.
    for claimed in group["trajectories"]:
        assert claimed["kept"] and claimed["version_spans"] and claimed["sampling_spans"]
        assert claimed["sampling_spans"][-1]["end"] <= len(claimed["response_ids"])
    assert client.claim("trainer-b")["claim_id"] is None
    assert client.ack(batch["claim_id"], "trainer-a")["trajectories"] == 2
    assert {r["consumed_by"] for r in client.trajectories(task_id=task_id, include_scripted=True)} == {"trainer-a"}
    assert client.trajectories(task_id=task_id, consumed=False) == []

    # The webhook: refused once with a 500, retried with the same idempotency key, then delivered (once).
    wait_for(lambda: (client.task(task_id)["callback"] or {}).get("delivered_at"))
    assert len(calls) == 2
    keys = {c["headers"]["idempotency-key"] for c in calls}
    assert keys == {f"polar-task-{task_id}"} and [c["headers"]["x-polar-attempt"] for c in calls] == ["1", "2"]
    assert calls[1]["body"]["status"] == "COMPLETED" and len(calls[1]["body"]["rollouts"]) == 2
    time.sleep(0.5)
    assert len(calls) == 2 and client.task(task_id)["callback"]["attempts"] == 2


def test_admission_holds_a_task_until_the_trainer_publishes_the_version(client, api_env, api_engine):
    """POLAR_MAX_ASYNC_LEVEL=0: a task for step n starts only once n versions are registered."""
    current = len(client.weights()["versions"])
    [task_id] = client.submit([answer_task(name="next-step", samples=1, metadata={"step": current + 1})])
    time.sleep(0.5)
    held = client.task(task_id)
    assert held["status"] == "PENDING" and held["dispatched_at"] is None and "ahead of" in held["held"]

    noise = torch.Generator().manual_seed(7)
    weights = {k: v + 0.01 * torch.randn(v.shape, generator=noise) for k, v in api_engine.model.state_dict().items()}
    version = f"step-{current + 1}"
    record = client.register_weights(version, state_dict=weights)
    assert record["version"] == version and record["ordinal"] == current + 1
    assert client.weights()["current"] == version and client.health()["current_version"] == version
    assert api_engine.weight_version == version

    [view] = client.wait([task_id], timeout_s=120)
    assert view["status"] == "COMPLETED" and view["held"] is None
    factory = store_factory(api_env)
    with factory() as db:
        versions = set(
            db.scalars(
                sa.select(Capture.weight_version)
                .join(Rollout, Rollout.id == Capture.rollout_id)
                .where(Rollout.task_id == task_id)
            )
        )
    assert versions == {version}
    with pytest.raises(ApiError) as duplicate:
        client.register_weights(version, state_dict=weights)
    assert duplicate.value.status_code == 409 and duplicate.value.field == "version"


def test_cancel_stops_a_running_task(client, api_env):
    sleeper = answer_task(
        name="sleeper",
        samples=2,
        harness={"name": "command", "config": {"command": "sleep 60"}},
        policies=None,
        timeout_s=300,
    )
    [task_id] = client.submit([sleeper])
    wait_for(lambda: client.task(task_id)["counts"].get("RUNNING") == 2)
    started = time.monotonic()
    result = client.cancel(task_id)
    assert result["status"] == "CANCELLED" and len(result["cancelled_rollouts"]) == 2
    view = client.task(task_id)
    assert view["status"] == "CANCELLED" and view["counts"] == {"CANCELLED": 2}
    time.sleep(1.0)  # the flows are gone: nothing writes the rollouts after the cancel
    assert client.task(task_id)["counts"] == {"CANCELLED": 2} and time.monotonic() - started < 10
    assert client.cancel(task_id)["cancelled_rollouts"] == []  # idempotent


@pytest.mark.parametrize(
    "change, field",
    [
        ({"harness": {"name": "no-such-harness"}}, "tasks.0.harness.name"),
        ({"instruction": None}, "tasks.0.instruction"),
        ({"num_samples": 0}, "tasks.0.num_samples"),
        ({"callback_url": "ftp://x"}, "tasks.0.callback_url"),
        ({"evaluator": {"type": "file", "config": {"nope": 1}}}, "tasks.0.evaluator.config.path"),
    ],
)
def test_bad_tasks_get_a_400_naming_the_field_and_store_nothing(client, change, field):
    task = {k: v for k, v in {**answer_task(), **change}.items() if v is not None}
    before = len(client._call("GET", "/v1/tasks", params={"limit": 1000})["tasks"])
    with pytest.raises(ApiError) as bad:
        client.submit([task])
    assert bad.value.status_code == 400 and bad.value.field == field, bad.value.message
    assert len(client._call("GET", "/v1/tasks", params={"limit": 1000})["tasks"]) == before


def test_unknown_ids_and_foreign_claims_get_clear_errors(client):
    for call in (lambda: client.task("nope"), lambda: client.cancel("nope"), lambda: client.ack("nope", "t")):
        with pytest.raises(ApiError) as missing:
            call()
        assert missing.value.status_code == 404
    with pytest.raises(ApiError) as bad:
        client.claim("t", max_groups=0)
    assert bad.value.status_code == 400 and bad.value.field == "max_groups"
    with pytest.raises(ApiError) as bad:
        client._call("POST", "/v1/weights", json={"checkpoint_path": "/x"})
    assert bad.value.status_code == 400 and bad.value.field == "version"
