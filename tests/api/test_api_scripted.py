"""The control API accepts scripted policies only when POLAR_ALLOW_SCRIPTED_POLICIES allows them."""

from __future__ import annotations

import httpx

from db import make_engine, make_session_factory, migrate
from flows.dispatch import run_inline
from polar.api.app import create_api
from polar.serving.threaded import ServerThread
from polar.settings import Settings, TaskDispatch
from tests.conftest import CONTROL

TASK = {
    "instruction": "Write polar into answer.txt.",
    "harness": {"name": "agent"},
    "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
    "policies": [{"replies": [{"content": "done"}]}],
}


def test_policies_are_refused_unless_a_setting_allows_them(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    migrate.upgrade(url)
    factory = make_session_factory(make_engine(url))
    settings = Settings(home=tmp_path, database_url=url, task_dispatch=TaskDispatch.INLINE)
    with ServerThread(create_api(settings, factory, run_inline=run_inline)) as server:
        response = httpx.post(server.url + "/v1/tasks", json={"tasks": [TASK]}, headers=CONTROL, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "tasks.0.policies" in error["message"] and "POLAR_ALLOW_SCRIPTED_POLICIES" in error["message"]
