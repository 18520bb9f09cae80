"""Submission ownership in the store: a task is started by one runner, whoever asks and however many at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db import make_engine, make_session_factory
from db.models import Task
from polar.api.runner import take_admissible
from polar.rollout import submit_tasks
from polar.rollout.dispatcher import new_dispatcher, split_owned
from tests.pg import STORES, migrated_store
from tests.rollout.helpers import answer_task


@pytest.fixture(params=STORES)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_store(request.param, tmp_path) as url:
        engine = make_engine(url)
        yield make_session_factory(engine)
        engine.dispose()


def _holders(factory: sessionmaker[Session]) -> dict[str, str | None]:
    with factory() as db:
        return {row.id: row.dispatcher for row in db.execute(sa.select(Task.id, Task.dispatcher))}


def test_a_runner_owns_what_it_submits_and_the_control_api_takes_only_the_rest(factory):
    batch = new_dispatcher("batch")
    (own,) = submit_tasks(factory, [answer_task(name="from-run")], dispatcher=batch)
    (posted,) = submit_tasks(factory, [answer_task(name="from-api")])
    with factory() as db:
        owned = db.get(Task, own.task_id)
        assert owned is not None and owned.dispatcher == batch and owned.dispatched_at is not None

    api = new_dispatcher("api")
    assert take_admissible(factory, None, api) == [(posted.task_id, list(posted.rollout_ids))]
    assert take_admissible(factory, None, new_dispatcher("api")) == []  # a second replica finds nothing left
    assert _holders(factory) == {own.task_id: batch, posted.task_id: api}

    mine, refused = split_owned(factory, [*posted.rollout_ids, *own.rollout_ids, "nope"], batch)
    assert mine == list(own.rollout_ids)
    assert set(refused) == {*posted.rollout_ids, "nope"}
    assert all(f"dispatched by another runner ({api})" in refused[r] for r in posted.rollout_ids)


def test_of_runners_taking_at_once_each_task_goes_to_exactly_one(factory):
    submitted = submit_tasks(factory, [answer_task(name=f"t{i}", samples=1) for i in range(6)])
    runners = [new_dispatcher("api") for _ in range(4)]
    start = threading.Barrier(len(runners))
    taken: dict[str, list[str]] = {}

    def run(dispatcher: str) -> None:
        start.wait()
        taken[dispatcher] = [task_id for task_id, _ in take_admissible(factory, None, dispatcher)]

    threads = [threading.Thread(target=run, args=(r,)) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [task_id for ids in taken.values() for task_id in ids]
    assert sorted(won) == sorted(t.task_id for t in submitted)  # every task once, none twice
    holders = _holders(factory)
    assert all(holders[task_id] == runner for runner, ids in taken.items() for task_id in ids)
