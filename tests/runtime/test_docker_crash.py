"""A flow process that freezes mid-run (SIGSTOP: alive, so its containers' lifelines hold, but silent) leaves its
container running; the retry flow takes the rollout over, kills the leftover harness in that container, ends the
rollout ERROR (here no relaunch is allowed: ``POLAR_RUN_RETRIES=0``; tests/runtime/test_docker_worker_death.py
has harnesses launched again) and removes the container. Nothing is leaked, also once the
frozen process is killed. (A flow process that dies stops its containers: tests/runtime/test_docker_worker_death.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import pytest

from db.enums import RolloutStatus
from flows.retry import retry_failed
from polar.rollout import submit_tasks
from polar.rollout.context import close_contexts, store_factory
from polar.runtime.docker_engine import LABEL
from polar.settings import get_settings
from tests.flows.conftest import polar_environment, prefect_server, wait_out_staleness  # noqa: F401
from tests.flows.test_flows import start_flow_process, wait_for
from tests.rollout.helpers import GIT_INIT, answer_task, rollout_row
from tests.runtime.conftest import IMAGE, tools_dir


@pytest.fixture
def docker_flow_env(monkeypatch, tmp_path, cache_dir, sqlite_url, sqlite_gateway, prefect_server):
    env = polar_environment(
        tmp_path, cache_dir, sqlite_url, sqlite_gateway.url, POLAR_TOOLS=str(tools_dir()), POLAR_DOCKER_IMAGE=IMAGE
    )
    env["POLAR_RUN_RETRIES"] = "0"  # a harness cut short is not launched again: the run ends ERROR (interrupted)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield tmp_path
    close_contexts()
    get_settings.cache_clear()


def polar_containers(engine, root) -> list:
    return [
        c
        for c in engine.containers.list(all=True, filters={"label": LABEL})
        if c.labels["polar.root"].startswith(str(root))
    ]


def freeze_outside_a_write(pid: int, sqlite_url: str) -> None:
    """SIGSTOP the process group, at a moment it holds no write lock on the SQLite store (a heartbeat's
    transaction frozen open would lock every other writer out: what this test is not about)."""
    path = sqlite_url.removeprefix("sqlite:///")
    for _ in range(50):
        os.killpg(pid, signal.SIGSTOP)
        probe = sqlite3.connect(path, timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:
            os.killpg(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError("the flow process held the store's write lock at every try")


async def test_a_frozen_flow_leaves_nothing_once_the_retry_flow_takes_over(
    docker_engine,
    docker_flow_env,
    sqlite_url,
    prefect_server,
    tmp_path,
):
    harness = {"name": "command", "config": {"command": "echo started > started.txt; sleep 300"}}
    task = answer_task(
        samples=1, policies=None, harness=harness, runtime={"type": "docker", "prepare": [{"command": GIT_INIT}]}
    )
    factory = store_factory()
    (rid,) = (await asyncio.to_thread(submit_tasks, factory, [task]))[0].rollout_ids
    child = start_flow_process(rid, prefect_server, tmp_path / "flow.log")
    try:
        started = docker_flow_env / "runtimes" / rid / "work" / "started.txt"
        await asyncio.to_thread(wait_for, started.exists, 120, "the harness to start in its container")
        await asyncio.to_thread(
            wait_for,
            lambda: "process" in rollout_row(factory, rid).stage_results.get("progress", {}).get("run", {}),
            30,
        )
        freeze_outside_a_write(child.pid, sqlite_url)  # it stops answering, with no chance to clean up
        (left,) = polar_containers(docker_engine, docker_flow_env)
        assert left.status == "running" and "sleep 300" in left.exec_run(["ps", "-eo", "args"]).output.decode()

        await wait_out_staleness()  # Prefect still has the frozen flow run Running
        result = await retry_failed(rollout_ids=[rid], stale_after_s=0)
        assert rid in result["retried"]
        row = rollout_row(factory, rid)
        assert row.status is RolloutStatus.ERROR and row.stage_results["run"]["interrupted"]
        assert row.stage_results["run"]["leftover_killed"] and row.stage_results["run"]["relaunches"] == 0
        assert polar_containers(docker_engine, docker_flow_env) == []
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert polar_containers(docker_engine, docker_flow_env) == []
