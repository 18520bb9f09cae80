"""``POST /v1/tasks`` with an ``Idempotency-Key``: a retry returns the first attempt's tasks (no duplicate), a
different batch under the same key is a 409 in the API's error shape; on SQLite and Postgres, also when the
retries race."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from db.models import Rollout, Task
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from tests.conftest import CONTROL
from tests.pg import STORES, migrated_store
from tests.rollout.helpers import answer_task, test_settings


@pytest.fixture(params=STORES)
def api_client(request, tmp_path, cache_dir) -> Iterator[tuple[TestClient, object]]:
    with migrated_store(request.param, tmp_path) as url:
        settings = test_settings(tmp_path, cache_dir, url, task_dispatch="inline")
        factory = store_factory(settings)
        with TestClient(
            create_api(settings, factory, run_inline=run_inline)
        ) as client:  # no `with`-lifespan dispatch: see below
            yield client, factory


def counts(factory) -> tuple[int, int]:
    with factory() as db:
        return db.scalar(sa.select(sa.func.count(Task.id))), db.scalar(sa.select(sa.func.count(Rollout.id)))


def post(client: TestClient, body: dict, key: str | None):
    headers = {**CONTROL, **({"Idempotency-Key": key} if key is not None else {})}
    return client.post("/v1/tasks", json=body, headers=headers)


def test_a_retry_with_the_same_key_returns_the_same_tasks(api_client):
    client, factory = api_client
    client.app.state.runner.tick = _no_dispatch  # stored, never started: this test is about submission
    body = {"tasks": [answer_task(name="a"), answer_task(name="b", samples=3)]}
    first = post(client, body, "retry-1")
    assert first.status_code == 201, first.text
    before = counts(factory)
    again = post(client, body, "retry-1")
    assert again.status_code == 201 and again.json() == first.json()
    assert counts(factory) == before == (2, 5)
    # without a key, or with another key, the same body is a new batch
    assert post(client, body, None).json() != first.json()
    assert post(client, body, "retry-2").json() != first.json()
    assert counts(factory) == (6, 15)


def test_the_same_key_with_another_batch_is_a_conflict(api_client):
    client, factory = api_client
    client.app.state.runner.tick = _no_dispatch
    assert post(client, {"tasks": [answer_task(name="a")]}, "k").status_code == 201
    reply = post(client, {"tasks": [answer_task(name="other")]}, "k")
    assert reply.status_code == 409
    assert reply.json()["error"]["type"] == "conflict_error" and reply.json()["error"]["field"] == "Idempotency-Key"
    bad = post(client, {"tasks": [answer_task()]}, "x" * 300)
    assert bad.status_code == 400 and "idempotency" in bad.json()["error"]["field"].lower()
    assert counts(factory) == (1, 2)


def test_racing_retries_create_one_batch(api_client):
    client, factory = api_client
    client.app.state.runner.tick = _no_dispatch
    body = {"tasks": [answer_task(name="race")]}
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: post(client, body, "race-key"), range(6)))
    assert {r.status_code for r in replies} == {201}
    assert len({str(r.json()) for r in replies}) == 1
    assert counts(factory) == (1, 2)


async def _no_dispatch() -> list[str]:
    return []
