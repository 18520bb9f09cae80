"""Cancel and takeover close (revoke) a rollout's gateway session before anything else: the key its harness holds
stops working at once. On SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flows.dispatch import run_inline
from polar.api import create_api
from polar.errors import PermissionDenied
from polar.proxy.session.sessions import SessionStore
from polar.rollout import state, submit_tasks
from polar.rollout.context import store_factory
from tests.conftest import CONTROL
from tests.pg import STORES, migrated_store
from tests.rollout.helpers import answer_task, rollout_row, test_settings


@pytest.fixture(params=STORES)
def store(request, tmp_path, cache_dir) -> Iterator[tuple]:
    with migrated_store(request.param, tmp_path) as url:
        settings = test_settings(tmp_path, cache_dir, url, task_dispatch="inline")
        yield settings, store_factory(settings)


def test_a_takeover_revokes_the_old_owners_session(store):
    settings, factory = store
    (rid,) = submit_tasks(factory, [answer_task(samples=1)])[0].rollout_ids
    sessions = SessionStore(factory)
    state.claim(factory, rid, "worker-a", default_timeout_s=60, stale_after_s=600)
    _, key = sessions.create(rollout_id=rid, replace_key=True)
    assert sessions.authenticate(key).id == rid
    state.claim(factory, rid, "worker-a", default_timeout_s=60, stale_after_s=600)  # the same owner again: no-op
    assert sessions.authenticate(key).id == rid
    state.claim(factory, rid, "worker-b", default_timeout_s=60, stale_after_s=0, takeover=True)
    with pytest.raises(PermissionDenied, match="closed"):
        sessions.authenticate(key)
    assert rollout_row(factory, rid).flow_run_id == "worker-b"


def test_cancel_revokes_the_sessions_of_the_cancelled_rollouts(store):
    settings, factory = store
    app = create_api(settings, factory, run_inline=run_inline)
    with TestClient(app) as client:
        app.state.runner.tick = _no_dispatch
        reply = client.post("/v1/tasks", json={"tasks": [answer_task(samples=2)]}, headers=CONTROL)
        task = reply.json()["tasks"][0]
        sessions = SessionStore(factory)
        keys = [sessions.create(rollout_id=rid, replace_key=True)[1] for rid in task["rollout_ids"]]
        assert all(sessions.authenticate(k) for k in keys)
        cancelled = client.post(f"/v1/tasks/{task['task_id']}/cancel", headers=CONTROL).json()
        assert sorted(cancelled["cancelled_rollouts"]) == sorted(task["rollout_ids"])
    for key in keys:
        with pytest.raises(PermissionDenied, match="closed"):
            sessions.authenticate(key)


async def _no_dispatch() -> list[str]:
    return []
