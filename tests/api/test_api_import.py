"""``POST /v1/tasks/import``: the repository's real datasets (datasets/harbor-mini folders, datasets/swe-mini's
JSONL) named by their path on the API's host become stored tasks; a missing path, a path outside
POLAR_COPY_ROOTS, a malformed task folder or instance is a 4xx naming the field, and nothing is stored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from db.migrate import upgrade
from db.models import Task
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from polar.settings import Settings
from tests.rollout.helpers import test_settings

REPO = Path(__file__).resolve().parents[2]
HARBOR = REPO / "datasets" / "harbor-mini"
SWE = REPO / "datasets" / "swe-mini" / "instances.jsonl"
AUTH = {"Authorization": "Bearer t0ken"}


@pytest.fixture
def settings(tmp_path, cache_dir) -> Settings:
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    roots = f"{REPO / 'datasets'},{tmp_path / 'mine'}"
    return test_settings(tmp_path, cache_dir, url, control_token="t0ken", task_dispatch="inline", copy_roots=roots)


@pytest.fixture
def store(settings) -> sessionmaker[Session]:
    return store_factory(settings)


@pytest.fixture
def client(settings, store) -> TestClient:
    # No lifespan: nothing is dispatched, the stored tasks are read back as submitted.
    return TestClient(create_api(settings, store, run_inline=run_inline))


def post(client: TestClient, body: dict) -> tuple[int, dict]:
    reply = client.post("/v1/tasks/import", json=body, headers=AUTH)
    return reply.status_code, reply.json()


def row(store: sessionmaker[Session], task_id: str) -> Task:
    with store() as db:
        return db.get_one(Task, task_id)


def stored(client: TestClient) -> list[dict]:
    return client.get("/v1/tasks", headers=AUTH).json()["tasks"]


def test_a_folder_of_harbor_tasks_becomes_tasks_with_their_own_evaluator(client, store):
    status, body = post(client, {"path": str(HARBOR), "samples": 2, "metadata": {"group": "harbor"}})
    assert status == 201, body
    names = sorted(task["name"] for task in body["tasks"])
    assert names == sorted(p.name for p in HARBOR.iterdir() if (p / "task.toml").is_file())
    assert all(len(task["rollout_ids"]) == 2 for task in body["tasks"])
    task = row(store, body["tasks"][0]["task_id"])
    assert task.evaluator["type"] == "harbor" and task.harness["name"] == "mini_swe_agent"
    assert task.meta["group"] == "harbor" and task.meta["source"] == "harbor"


def test_a_swebench_jsonl_becomes_tasks_graded_by_swebench(client, store):
    harness = {"name": "command", "config": {"command": "true"}}
    status, body = post(client, {"path": str(SWE), "harness": harness})
    assert status == 201, body
    assert sorted(t["name"] for t in body["tasks"]) == [f"polar-example__textkit-{n}" for n in (1, 2, 3)]
    task = row(store, body["tasks"][0]["task_id"])
    assert task.evaluator["type"] == "swebench" and task.harness == {**harness, "model": "polar"}
    assert task.runtime["options"]["network"] == "none"


def test_bad_paths_and_bad_tasks_are_4xx_naming_the_field_and_store_nothing(client, tmp_path):
    status, body = post(client, {"path": str(REPO / "datasets" / "nope")})
    assert status == 400 and body["error"]["field"] == "path" and "does not exist" in body["error"]["message"]
    status, body = post(client, {"path": "/etc"})
    assert status == 403 and body["error"]["field"] == "path" and "POLAR_COPY_ROOTS" in body["error"]["message"]
    status, body = post(client, {"path": str(REPO / "datasets" / "sft_toy.jsonl").replace(".jsonl", ".json")})
    assert status == 400 and body["error"]["field"] == "path"
    status, body = post(client, {})
    assert status == 400 and body["error"]["field"] == "path"

    # A task folder without instruction.md: the task and the file named.
    mine = tmp_path / "mine"
    shutil.copytree(HARBOR / "hello-file", mine / "hello-file")
    (mine / "hello-file" / "instruction.md").unlink()
    status, body = post(client, {"path": str(mine)})
    assert status == 400 and "hello-file" in body["error"]["message"], body
    assert "instruction.md" in body["error"]["message"]

    # An instance without its FAIL_TO_PASS list: the instance and the field named.
    rows = [json.loads(line) for line in SWE.read_text().splitlines()]
    del rows[1]["FAIL_TO_PASS"]
    (mine / "bad.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, body = post(client, {"path": str(mine / "bad.jsonl")})
    assert status == 400 and body["error"]["field"] == "FAIL_TO_PASS"
    assert rows[1]["instance_id"] in body["error"]["message"]
    assert stored(client) == []


def test_scripted_policies_are_refused_unless_allowed(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(
        tmp_path, cache_dir, url, control_token="t0ken", copy_roots=str(HARBOR), allow_scripted_policies=False
    )
    client = TestClient(create_api(settings, store_factory(settings), run_inline=run_inline))
    status, body = post(client, {"path": str(HARBOR / "hello-file"), "policies": [{"type": "replay", "replies": []}]})
    assert status == 400 and body["error"]["field"] == "policies"
