"""mini-swe-agent (the real package, ``polar harness install mini_swe_agent``) in a network-isolated docker runtime,
driven in its text mode (THOUGHT plus one bash block per reply) by a scripted policy's tool-free replies: it
solves a Harbor task (reward 1) and a SWE-bench instance (reward 1) through the rollout pipeline, and a wrong fix
scores 0. Its calls reach the gateway through litellm's OpenAI client, so they are captured."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from db.enums import RolloutStatus
from harness_adapters.install import TOOLS
from polar.tasks.harbor import read_task
from polar.tasks.swebench import load_swebench
from tests.rollout.helpers import captures
from tests.runtime.conftest import tools_dir
from tests.runtime.test_docker_faults import drive, stage_error

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(autouse=True)
def installed() -> None:
    if not TOOLS["mini_swe_agent"].installed(tools_dir()):
        pytest.skip(f"mini-swe-agent is not installed in {tools_dir()}: polar harness install mini_swe_agent")


def text_policy(*commands: str) -> dict:
    """Replies in mini-swe-agent's text format, one command each, then the submission."""
    replies = [
        {"content": f"THOUGHT: step {i}.\n\n```mswea_bash_command\n{command}\n```"}
        for i, command in enumerate([*commands, SUBMIT])
    ]
    return {"type": "scripted", "tool_free_replies": replies, "tool_free_reply": "THOUGHT: nothing more."}


MINI = {"name": "mini_swe_agent", "config": {"mode": "text", "step_limit": 10}}


async def test_mini_swe_agent_solves_a_harbor_task(docker_context, no_leaks):
    path = Path(shutil.copytree(REPO / "datasets" / "harbor-mini" / "hello-file", no_leaks / "tasks" / "hello-file"))
    task = read_task(path).request(MINI, policies=[text_policy("echo 'hello, polar' > /app/greeting.txt")])
    row, _ = await drive(docker_context, task, no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, stage_error(row)
    assert len(captures(docker_context.factory, row.id)) == 2  # one call per action, through the gateway


async def test_mini_swe_agent_solves_a_swebench_instance_and_a_wrong_fix_scores_0(docker_context, no_leaks):
    (instance,) = [
        i for i in load_swebench(REPO / "datasets" / "swe-mini" / "instances.jsonl") if i.task_id.endswith("-3")
    ]
    fix = "sed -i 's/minutes + seconds/minutes * 60 + seconds/' textkit/duration.py"
    row, _ = await drive(
        docker_context, instance.request(MINI, policies=[text_policy("cat textkit/duration.py", fix)]), no_leaks
    )
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, stage_error(row)
    wrong = "sed -i 's/minutes + seconds/minutes * 6 + seconds/' textkit/duration.py"
    row, _ = await drive(docker_context, instance.request(MINI, policies=[text_policy(wrong)]), no_leaks)
    assert row.status is RolloutStatus.COMPLETED and row.reward == 0.0, stage_error(row)
