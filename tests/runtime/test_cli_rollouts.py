"""The six agent CLIs as real rollouts: each runs a task through the full Prefect rollout flow, in the docker
runtime and in the local runtime, driven by the scripted policy, and the evaluator rewards what it did.

One batch flow holds every (CLI, runtime) task with two samples: the first sample's script has the CLI call its
own shell tool to write ``hello.txt`` (reward 1 from the file check), the second's only answers in text
(reward 0). Each rollout is a flow run with four task runs; its captures and merged trajectories are in the
store. One gateway (the ``tiny-long`` model, whose 64k positions fit the CLIs' prompts) and one Prefect server
serve the whole module. The CLIs come from ``scripts/install_harnesses.sh`` / ``polar harness install``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from db import make_engine, make_session_factory
from db.enums import RolloutStatus
from flows.batch import rollout_batch
from harness_adapters import ADAPTERS
from polar.backends.local import LocalBackend
from polar.proxy.embedded import EmbeddedGateway
from polar.rollout.context import close_contexts
from polar.runtime.docker_engine import LABEL
from polar.settings import get_settings
from tests.flows.conftest import polar_environment, prefect_server  # noqa: F401
from tests.flows.prefect_api import task_runs_of
from tests.rollout.helpers import GIT_INIT, captures, rollout_row, test_settings, trajectories
from tests.runtime.conftest import IMAGE, tools_dir

pytestmark = pytest.mark.e2e

# Each CLI's own shell tool and how it takes a command (tests/e2e/harnesses.py has the full tool loops).
SHELL_TOOLS = {
    "codex": ("exec_command", "cmd"),
    "claude_code": ("Bash", "command"),
    "gemini_cli": ("run_shell_command", "command"),
    "qwen_code": ("run_shell_command", "command"),
    "opencode": ("bash", "command"),
    "pi": ("bash", "command"),
}
# POLAR_TEST_CLIS=pi,codex narrows the batch while working on one adapter.
CLIS = tuple(os.environ["POLAR_TEST_CLIS"].split(",")) if os.environ.get("POLAR_TEST_CLIS") else tuple(SHELL_TOOLS)
RUNTIMES = ("docker", "local")


def solving(cli: str) -> dict:
    tool, argument = SHELL_TOOLS[cli]
    call = {"name": tool, "arguments": {argument: "printf hi > hello.txt"}}
    return {
        "type": "scripted",
        "replies": [{"content": "I will write the file.", "tool_calls": [call]}],
        "then": "Done.",
    }


FAILING = {"type": "scripted", "replies": [{"content": "I cannot do that."}], "then": "I cannot do that."}


def cli_task(cli: str, runtime: str) -> dict:
    return {
        "name": f"{cli}-{runtime}",
        "instruction": "Create the file hello.txt containing exactly hi.",
        "harness": {"name": cli, "model": "polar-tiny"},
        "runtime": {"type": runtime, "prepare": [{"command": GIT_INIT}]},
        "evaluator": {"type": "file", "config": {"path": "hello.txt", "equals": "hi"}},
        "num_samples": 2,
        "policies": [solving(cli), FAILING],
        "agent_timeout_s": 300,
    }


@pytest.fixture(scope="module")
def long_gateway(tmp_path_factory, cache_dir, sqlite_url) -> Iterator[EmbeddedGateway]:
    settings = test_settings(tmp_path_factory.mktemp("gw"), cache_dir, sqlite_url, model="tiny-long")
    gateway = EmbeddedGateway(settings, backend=LocalBackend.from_spec("tiny-long", cache_dir, threads=2)).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def batch(docker_engine, long_gateway, prefect_server, sqlite_url, tmp_path_factory, cache_dir):
    """Runs the one batch of the module (every CLI in every runtime); returns each task's rollout ids by name, and
    how each rollout's flow run ended (the batch summary's ``flow``: says why a rollout was never taken)."""
    missing = [ADAPTERS[cli].pin.name for cli in CLIS if not ADAPTERS[cli].pin.installed(tools_dir())]
    if missing or not (tools_dir() / "node" / "bin" / "node").exists():
        pytest.skip(f"CLIs not installed in {tools_dir()} ({missing or 'node'}): make tools")
    home = tmp_path_factory.mktemp("home")
    env = polar_environment(
        home,
        cache_dir,
        sqlite_url,
        long_gateway.url,
        POLAR_TOOLS=str(tools_dir()),
        POLAR_DOCKER_IMAGE=IMAGE,
        POLAR_BATCH_MAX_ACTIVE="6",
        POLAR_RUN_CONCURRENCY="4",
        POLAR_RUN_RETRIES="0",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        tasks = [cli_task(cli, runtime) for cli in CLIS for runtime in RUNTIMES]
        summary = asyncio.run(rollout_batch(tasks=tasks))
        close_contexts()
    get_settings.cache_clear()
    left = [
        c.name
        for c in docker_engine.containers.list(all=True, filters={"label": LABEL})
        if c.labels["polar.root"].startswith(str(home))
    ]
    assert not left, f"containers left behind by the batch: {left}"
    ids = {task["name"]: ids for task, ids in zip(tasks, summary["tasks"].values(), strict=True)}
    return ids, {rid: item["flow"] for rid, item in summary["rollouts"].items()}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("cli", CLIS)
def test_the_cli_solves_with_the_solving_script_and_fails_with_the_other(batch, cli, runtime, sqlite_url):
    factory = make_session_factory(make_engine(sqlite_url))
    ids, flows = batch
    solved, failed = (rollout_row(factory, rid) for rid in ids[f"{cli}-{runtime}"])
    for row, reward, n_calls in ((solved, 1.0, 2), (failed, 0.0, 1)):
        run = row.stage_results.get("run", {})
        assert row.status is RolloutStatus.COMPLETED, (row.error, flows[row.id], run.get("stderr_tail"))
        assert row.reward == reward
        assert row.stage_results["init"]["runtime"]["type"] == runtime
        calls = captures(factory, row.id)
        assert len(calls) >= n_calls and all(c.status.value == "OK" for c in calls)
        traces = trajectories(factory, row.id)
        assert traces and {t.builder for t in traces} == {"prefix_merge"}
        # Scripted replies never train: the trajectory carries the reward with its loss mask zeroed.
        assert any(t.reward == reward and t.scripted and t.n_loss_tokens == 0 for t in traces)
    runs = asyncio.run(task_runs_of(solved.flow_run_id, expect=4))
    assert [r.name for r in runs] == [f"{stage}-{solved.id}" for stage in ("init", "run", "postrun", "evaluate")]
