"""Reward components shown on their own: a swebench evaluation graded by the official rules from a pytest log (a
PASS_TO_PASS test broken) and a harbor evaluation with named reward.json components, stored on a rollout, read
through ``GET /v1/rollouts/{id}`` (typed ``components``) and on the rollout's web page."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from db.engine import make_engine, make_session_factory, session_scope
from db.enums import RolloutStatus
from db.migrate import upgrade
from db.models import Evaluation, Rollout, Task
from flows.dispatch import run_inline
from polar.api import create_api
from polar.evaluators.components import RewardComponents, reward_components
from polar.evaluators.harbor import reward_from
from polar.evaluators.swebench import grade
from tests.rollout.helpers import test_settings
from tests.tasks.test_swebench_import import _config, _log

AUTH = {"Authorization": "Bearer c0mponents"}


def test_components_of_swebench_and_harbor_on_the_api_and_the_page(tmp_path: Path, cache_dir):
    statuses = {"test_minutes": "PASSED", "test_hours": "FAILED", "test_seconds": "PASSED", "test_bad": "PASSED"}
    swe_reward, swe_details = grade(_config(), _log(tmp_path, statuses))
    harbor_reward, harbor_details = reward_from(None, json.dumps({"reward": 0.5, "style": 1, "tests": 0}), "reward")

    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        task = Task(name="t", instruction="x", harness={"name": "command"}, runtime={}, evaluator={}, num_samples=1)
        db.add(task)
        db.flush()
        row = Rollout(task_id=task.id, sample_index=0, status=RolloutStatus.COMPLETED, reward=swe_reward)
        db.add(row)
        db.flush()
        db.add(Evaluation(rollout_id=row.id, evaluator="swebench", reward=swe_reward, details=swe_details))
        db.add(Evaluation(rollout_id=row.id, evaluator="harbor", reward=harbor_reward, details=harbor_details))
        rollout_id = row.id
    settings = test_settings(tmp_path, cache_dir, url, control_token="c0mponents", task_dispatch="inline")
    client = TestClient(create_api(settings, factory, run_inline=run_inline))

    view = client.get(f"/v1/rollouts/{rollout_id}", headers=AUTH).json()
    swe, harbor = (RewardComponents.model_validate(e["components"]) for e in view["evaluations"])
    assert swe.resolution == "RESOLVED_NO" and swe_reward == 0.0
    assert swe.fail_to_pass is not None and (swe.fail_to_pass.passed, swe.fail_to_pass.failed) == (1, 0)
    assert swe.pass_to_pass is not None and swe.pass_to_pass.failed == 1
    assert swe.pass_to_pass.failed_tests == ["tests/test_duration.py::test_hours"]
    assert swe.counts == {"passed": 3, "failed": 1} and swe.tests["tests/test_duration.py::test_hours"] == "FAILED"
    assert harbor.named == {"reward": 0.5, "style": 1.0, "tests": 0.0} and harbor.rule == "reward"

    page = client.get(f"/ui/rollouts/{rollout_id}", headers=AUTH)
    assert page.status_code == 200, page.text
    html = page.text
    assert "resolution <b>RESOLVED_NO</b>" in html
    assert re.search(
        r'data-group="PASS_TO_PASS">PASS_TO_PASS: \d+ passed, 1 failed \(<code>tests/test_duration.py::'
        r"test_hours</code>\)",
        html,
    )
    assert 'data-group="FAIL_TO_PASS">FAIL_TO_PASS: 1 passed, 0 failed' in html
    assert re.search(r'<tr data-component="style"><td>style</td><td class="num">1', html)


def test_unknown_or_older_details_give_empty_components():
    assert reward_components("command", 1.0, {"returncode": 0}).empty
    assert reward_components("swebench", 0.0, {"report": "not a mapping", "tests_status": None}).empty
    assert reward_components("tests", 1.0, {"counts": {"passed": 3, "failed": 0}}).counts == {"passed": 3, "failed": 0}
