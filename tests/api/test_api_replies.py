"""The control API's reply models (``polar.api.schemas``): every route declares one, so the OpenAPI spec shows
real bodies; keys some replies leave out stay left out (a task's ``flow_run_state`` outside deployment dispatch);
and a reply model serializes exactly the read model it wraps, keys in order."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.api.schemas import TaskSummary, TrajectoryExtrasView
from polar.rollout.context import store_factory
from polar.trajectory.extras import TrajectoryExtras, extras_json
from tests.conftest import CONTROL
from tests.rollout.helpers import answer_task, test_settings


def _client(tmp_path, cache_dir, dispatch: str) -> TestClient:
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, task_dispatch=dispatch)
    return TestClient(create_api(settings, store_factory(settings), run_inline=run_inline))  # no lifespan


def test_every_route_declares_its_reply_in_the_spec(tmp_path, cache_dir):
    spec = _client(tmp_path, cache_dir, "inline").get("/openapi.json").json()
    operations = [(method, path, op) for path, item in spec["paths"].items() for method, op in item.items()]
    assert len(operations) == 18
    for method, path, op in operations:
        if path == "/metrics":
            assert "text/plain" in op["responses"]["200"]["content"]
            continue
        ok = op["responses"]["201" if "201" in op["responses"] else "200"]
        ref = ok["content"]["application/json"]["schema"]["$ref"]
        body = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert body["properties"], (method, path)
        if path.startswith("/v1"):
            error = op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
            assert error.endswith("/ErrorReply"), (method, path)


@pytest.mark.parametrize("dispatch", ["inline", "deployment"])
def test_a_rollouts_flow_run_state_is_there_only_under_deployment_dispatch(tmp_path, cache_dir, dispatch):
    client = _client(tmp_path, cache_dir, dispatch)
    submitted = client.post("/v1/tasks", json={"tasks": [answer_task(name="a")]}, headers=CONTROL)
    assert submitted.status_code == 201, submitted.text
    [task] = submitted.json()["tasks"]
    assert list(task) == ["task_id", "name", "rollout_ids"] and len(task["rollout_ids"]) == 2
    view = client.get(f"/v1/tasks/{task['task_id']}", headers=CONTROL).json()
    assert view["status"] == "PENDING" and len(view["rollouts"]) == 2
    for rollout in view["rollouts"]:
        assert list(rollout)[-1] == ("flow_run_state" if dispatch == "deployment" else "finished_at")
        assert rollout.get("flow_run_state") is None  # not started: no flow run yet
    cancelled = client.post(f"/v1/tasks/{task['task_id']}/cancel", headers=CONTROL).json()
    assert cancelled == {"task_id": task["task_id"], "status": "CANCELLED", "cancelled_rollouts": task["rollout_ids"]}


def test_the_extras_reply_is_the_read_model_key_for_key():
    extras = TrajectoryExtras(
        top_ids=np.array([[3, 4], [5, 6]], np.int32),
        top_logprobs=np.array([[-0.1, -2.5], [-1e-5, -7.0]], np.float32),
        top_mask=np.array([True, False]),
        routed_experts=np.arange(12, dtype=np.uint16).reshape(3, 2, 2),
        experts_mask=np.array([True, True, False]),
    )
    for value in (extras, None):
        view = extras_json(7, value)
        assert TrajectoryExtrasView.model_validate(view).model_dump(mode="json") == view
        assert json.dumps(TrajectoryExtrasView.model_validate(view).model_dump(mode="json")) == json.dumps(view)


def test_a_reply_refuses_a_key_it_does_not_declare():
    """A key a read model grows without its reply model is an error the tests see, never silently dropped."""
    row = {"task_id": "t", "name": None, "status": "PENDING", "num_samples": 1, "created_at": None, "finished_at": None}
    assert TaskSummary.model_validate(row).model_dump(mode="json") == row
    with pytest.raises(ValidationError):
        TaskSummary.model_validate({**row, "new_key": 1})
