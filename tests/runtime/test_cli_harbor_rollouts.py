"""Codex, Claude Code and mini-swe-agent on a real Harbor task (datasets/harbor-mini/hello-file) and a SWE-bench
instance (datasets/swe-mini's polar-example__textkit-3, its image from scripts/build_swe_instances.py): each harness
runs through the full Prefect rollout flow (init, run, postrun, evaluate) in the docker runtime, in the task's own
image (network ``none``: the gateway is reached through the runtime's tunnel), graded by the task's own rules:
the Harbor verifier (``tests/test.sh``, the ``harbor`` evaluator) or the official SWE-bench grading
(``swebench``). Every sample's scripted policy has the harness run one shell command through its own tool (the
CLIs' shell tools; mini-swe-agent's text mode: THOUGHT plus one bash block per reply, then its submission): the
fix (reward 1), a wrong fix (0), and on the instance a fix that breaks a PASS_TO_PASS test (0, that test named).
mini-swe-agent also solves the task in an image with no Python at all, on the Python the tools folder brings.
The gateway's ``tiny-long`` model and the CLIs' pins are those of tests/runtime/test_cli_rollouts.py.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import make_engine, make_session_factory
from db.enums import RolloutStatus
from flows.batch import rollout_batch
from harness_adapters.install import TOOLS
from polar.rollout.context import close_contexts
from polar.settings import get_settings
from polar.tasks import load_harbor
from tests.flows.conftest import polar_environment, prefect_server  # noqa: F401
from tests.flows.prefect_api import task_runs_of
from tests.rollout.helpers import captures, evaluations, rollout_row
from tests.runtime.conftest import IMAGE, tools_dir
from tests.runtime.test_cli_rollouts import SHELL_TOOLS, long_gateway  # noqa: F401
from tests.runtime.test_swebench_rollouts import swe_instances  # noqa: F401

pytestmark = pytest.mark.e2e

TASK = Path(__file__).resolve().parents[2] / "datasets" / "harbor-mini" / "hello-file"
PINS = {"codex": TOOLS["codex"], "claude_code": TOOLS["claude"], "mini_swe_agent": TOOLS["mini_swe_agent"]}
CLIS = tuple(PINS)
COMMANDS = {  # sample -> the shell command the harness runs
    "harbor": {"solves": "echo 'hello, polar' > /app/greeting.txt", "wrong": "echo 'hello polar' > /app/greeting.txt"},
    "swebench": {
        "solves": "sed -i 's/minutes + seconds/minutes * 60 + seconds/' textkit/duration.py",  # the gold change
        "wrong": "sed -i 's/minutes + seconds/minutes * 61 + seconds/' textkit/duration.py",
        "breaks": "sed -i 's/minutes + seconds/minutes * 60 + seconds * 2/' textkit/duration.py",
    },
}
REWARDS = {"solves": 1.0, "wrong": 0.0, "breaks": 0.0}
INSTANCE = "polar-example__textkit-3"
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def harness(cli: str) -> dict:
    if cli == "mini_swe_agent":
        return {"name": cli, "model": "polar-tiny", "config": {"mode": "text", "step_limit": 10}}
    return {"name": cli, "model": "polar-tiny"}


def policy(cli: str, command: str) -> dict:
    """The harness runs ``command`` through its own shell tool, then says it is done."""
    if cli == "mini_swe_agent":  # text mode: tool-free replies, one bash block each, the last one submits
        replies = [
            {"content": f"THOUGHT: step {i}.\n\n```mswea_bash_command\n{action}\n```"}
            for i, action in enumerate([command, MINI_SUBMIT])
        ]
        return {"type": "scripted", "tool_free_replies": replies, "tool_free_reply": "THOUGHT: nothing more."}
    tool, argument = SHELL_TOOLS[cli]
    call = {"name": tool, "arguments": {argument: command}}
    return {"type": "scripted", "replies": [{"content": "Running it.", "tool_calls": [call]}], "then": "Done."}


def without_python(root: Path) -> Path:
    """hello-file in an image with no Python (its verifier in shell): only the tools' Python can run the agent."""
    folder = Path(shutil.copytree(TASK, root / "hello-no-python"))
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {IMAGE}\nRUN rm -rf /usr/bin/python3* /usr/lib/python3* /usr/local/bin/python3*\nWORKDIR /app\n"
    )
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif grep -qx 'hello, polar' /app/greeting.txt; then echo 1; else echo 0; fi"
        " > /logs/verifier/reward.txt\n"
    )
    return folder


@pytest.fixture(scope="module")
def batch(
    docker_engine, long_gateway, prefect_server, sqlite_url, tmp_path_factory, cache_dir, swe_instances
) -> Iterator[dict]:
    missing = [cli for cli, pin in PINS.items() if not pin.installed(tools_dir())]
    if missing or not (tools_dir() / "node" / "bin" / "node").exists():
        pytest.skip(f"CLIs not installed in {tools_dir()} ({missing or 'node'}): make tools")
    [task] = load_harbor([TASK])
    [bare] = load_harbor([without_python(tmp_path_factory.mktemp("tasks"))])
    env = polar_environment(
        tmp_path_factory.mktemp("home"),
        cache_dir,
        sqlite_url,
        long_gateway.url,
        POLAR_TOOLS=str(tools_dir()),
        POLAR_DOCKER_IMAGE=IMAGE,
        POLAR_COPY_ROOTS=f"{TASK.parent},{bare.path.parent}",
        POLAR_RUN_RETRIES="0",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        tasks = []
        for cli in CLIS:
            for kind, source in (("harbor", task), ("swebench", swe_instances[INSTANCE])):
                policies = [policy(cli, command) for command in COMMANDS[kind].values()]
                request = source.request(harness(cli), samples=len(policies), policies=policies)
                tasks.append({**request, "name": f"{cli}-{kind}"})
        solves = [policy("mini_swe_agent", COMMANDS["harbor"]["solves"])]
        request = bare.request(harness("mini_swe_agent"), samples=1, policies=solves)
        tasks.append({**request, "name": "mini_swe_agent-no-python"})
        summary = asyncio.run(rollout_batch(tasks=tasks))
        close_contexts()
    get_settings.cache_clear()
    yield {t["name"]: ids for t, ids in zip(tasks, summary["tasks"].values(), strict=True)}


@pytest.mark.parametrize("kind", ("harbor", "swebench"))
@pytest.mark.parametrize("cli", CLIS)
def test_the_harness_is_graded_by_the_tasks_own_rules(batch, cli, kind, sqlite_url):
    factory = make_session_factory(make_engine(sqlite_url))
    rows = dict(zip(COMMANDS[kind], (rollout_row(factory, rid) for rid in batch[f"{cli}-{kind}"]), strict=True))
    for sample, row in rows.items():
        where = (sample, row.error, row.stage_results.get("run", {}).get("stderr_tail"))
        assert row.status is RolloutStatus.COMPLETED and row.reward == REWARDS[sample], where
        assert captures(factory, row.id), where  # its model calls went through the gateway
        [evaluation] = evaluations(factory, row.id)
        assert evaluation.evaluator == kind
        if kind == "swebench":
            assert evaluation.details["resolution"] == ("RESOLVED_FULL" if row.reward else "RESOLVED_NO"), where
    if kind == "swebench":  # the wrong fix's FAIL_TO_PASS test is named, and the PASS_TO_PASS test it broke
        [wrong], [broke] = (evaluations(factory, rows[sample].id) for sample in ("wrong", "breaks"))
        assert wrong.details["failed_fail_to_pass"] == ["tests/test_duration.py::test_minutes"]
        assert broke.details["failed_pass_to_pass"] == ["tests/test_duration.py::test_seconds"]
        assert broke.details["failed_fail_to_pass"] == []
    runs = asyncio.run(task_runs_of(rows["solves"].flow_run_id, expect=4))
    assert [r.name for r in runs] == [
        f"{stage}-{rows['solves'].id}" for stage in ("init", "run", "postrun", "evaluate")
    ]


def test_mini_swe_agent_runs_on_the_tools_python_in_an_image_without_one(batch, sqlite_url):
    factory = make_session_factory(make_engine(sqlite_url))
    [row] = (rollout_row(factory, rid) for rid in batch["mini_swe_agent-no-python"])
    where = (row.error, row.stage_results.get("run", {}).get("stderr_tail"))
    assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, where
    assert captures(factory, row.id), where
