"""Codex and Claude Code on a real Harbor task (datasets/harbor-mini/hello-file) and a SWE-bench instance
(datasets/swe-mini's polar-example__textkit-1, its image from scripts/build_swe_instances.py): each CLI runs
through the full Prefect rollout flow (init, run, postrun, evaluate) in the docker runtime, in the task's own
image (network ``none``: the gateway is reached through the runtime's tunnel), graded by the task's own rules:
the Harbor verifier (``tests/test.sh``, the ``harbor`` evaluator) or the official SWE-bench grading
(``swebench``). Scripted replies: the first sample's script has the CLI run the fix through its own shell tool
(reward 1), the second's only answers in text (reward 0). The gateway's ``tiny-long`` model and the CLIs' pins
are those of tests/runtime/test_cli_rollouts.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import make_engine, make_session_factory
from db.enums import RolloutStatus
from flows.batch import rollout_batch
from harness_adapters import ADAPTERS
from polar.rollout.context import close_contexts
from polar.settings import get_settings
from polar.tasks import load_harbor
from tests.flows.conftest import polar_environment, prefect_server  # noqa: F401
from tests.flows.prefect_api import task_runs_of
from tests.rollout.helpers import evaluations, rollout_row
from tests.runtime.conftest import IMAGE, tools_dir
from tests.runtime.test_cli_rollouts import FAILING, SHELL_TOOLS, long_gateway  # noqa: F401
from tests.runtime.test_swebench_rollouts import swe_instances  # noqa: F401

pytestmark = pytest.mark.e2e

TASK = Path(__file__).resolve().parents[2] / "datasets" / "harbor-mini" / "hello-file"
CLIS = ("codex", "claude_code")
FIXES = {
    "harbor": "echo 'hello, polar' > /app/greeting.txt",
    "swebench": "sed -i 's/\\[^a-z0-9\\]\"/[^a-z0-9]+\"/' textkit/slug.py",  # the gold patch's change
}
INSTANCE = "polar-example__textkit-1"


def solving(cli: str, kind: str) -> dict:
    tool, argument = SHELL_TOOLS[cli]
    call = {"name": tool, "arguments": {argument: FIXES[kind]}}
    return {"type": "scripted", "replies": [{"content": "Writing it.", "tool_calls": [call]}], "then": "Done."}


@pytest.fixture(scope="module")
def batch(
    docker_engine, long_gateway, prefect_server, sqlite_url, tmp_path_factory, cache_dir, swe_instances
) -> Iterator[dict]:
    missing = [ADAPTERS[cli].pin.name for cli in CLIS if not ADAPTERS[cli].pin.installed(tools_dir())]
    if missing or not (tools_dir() / "node" / "bin" / "node").exists():
        pytest.skip(f"CLIs not installed in {tools_dir()} ({missing or 'node'}): make tools")
    [task] = load_harbor([TASK])
    env = polar_environment(
        tmp_path_factory.mktemp("home"),
        cache_dir,
        sqlite_url,
        long_gateway.url,
        POLAR_TOOLS=str(tools_dir()),
        POLAR_DOCKER_IMAGE=IMAGE,
        POLAR_COPY_ROOTS=str(TASK.parent),
        POLAR_RUN_RETRIES="0",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        tasks = []
        for cli in CLIS:
            for kind, source in (("harbor", task), ("swebench", swe_instances[INSTANCE])):
                harness = {"name": cli, "model": "polar-tiny"}
                request = source.request(harness, samples=2, policies=[solving(cli, kind), FAILING])
                tasks.append({**request, "name": f"{cli}-{kind}"})
        summary = asyncio.run(rollout_batch(tasks=tasks))
        close_contexts()
    get_settings.cache_clear()
    yield {t["name"]: ids for t, ids in zip(tasks, summary["tasks"].values(), strict=True)}


@pytest.mark.parametrize("kind", ("harbor", "swebench"))
@pytest.mark.parametrize("cli", CLIS)
def test_the_cli_solves_the_task_graded_by_its_own_rules(batch, cli, kind, sqlite_url):
    factory = make_session_factory(make_engine(sqlite_url))
    solved, failed = (rollout_row(factory, rid) for rid in batch[f"{cli}-{kind}"])
    for row, reward in ((solved, 1.0), (failed, 0.0)):
        assert row.status is RolloutStatus.COMPLETED, (row.error, row.stage_results.get("run", {}).get("stderr_tail"))
        assert row.reward == reward
        [evaluation] = evaluations(factory, row.id)
        assert evaluation.evaluator == kind
        if kind == "swebench":
            assert evaluation.details["resolution"] == ("RESOLVED_FULL" if reward else "RESOLVED_NO")
    runs = asyncio.run(task_runs_of(solved.flow_run_id, expect=4))
    assert [r.name for r in runs] == [f"{stage}-{solved.id}" for stage in ("init", "run", "postrun", "evaluate")]
