"""Kill -9 of a worker mid-batch (``polar run``, local runtime, Postgres): the rollouts whose harness had finished
end COMPLETED with their real reward after the retry, the harnesses still running die with the worker and are
launched again by the retry (a fresh session, the runtime prepared afresh), ending COMPLETED with their real reward
too; the cut-short launches' captures are kept, set aside (INTERRUPTED) and in no trajectory, and no process is left.

To catch a worker exactly between "the harness exited" and "the end is recorded", the test freezes the worker
(SIGSTOP) just before those harnesses finish and kills it once they have: the window a stalled or overloaded
worker opens. The harnesses and the gateway are other processes and go on meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from db.enums import CaptureStatus, RolloutStatus
from db.models import Rollout, Task
from flows.retry import retry_failed
from polar.clock import now
from polar.rollout.context import close_contexts, store_factory
from polar.runtime.launcher import EXIT_FILE
from polar.settings import get_settings
from tests.flows.conftest import polar_environment, wait_out_staleness
from tests.pg import needs_postgres
from tests.rollout.conftest import start_gateway
from tests.rollout.helpers import answer_task, bash, captures, rollout_row, script, trajectories

pytestmark = needs_postgres
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg_gateway(tmp_path_factory, cache_dir, postgres_url, engine):
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, postgres_url, engine)
    yield gateway
    gateway.stop()


@pytest.fixture
def worker_env(monkeypatch, tmp_path, cache_dir, postgres_url, pg_gateway, prefect_server) -> Iterator[dict]:
    env = polar_environment(
        tmp_path,
        cache_dir,
        postgres_url,
        pg_gateway.url,
    )
    env.update(PREFECT_API_URL=prefect_server, POLAR_RUN_CONCURRENCY="8", POLAR_BATCH_MAX_ACTIVE="8")
    # The harnesses wait on gate files the test holds on the host: host exec, set explicitly (the sandbox's own
    # death with its worker: tests/runtime/test_local_sandbox.py).
    env.update(POLAR_RUNTIME_ISOLATION="none")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield env
    close_contexts()
    get_settings.cache_clear()


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launchers_under(root: Path) -> list[int]:
    """Live processes whose command line mentions a runtime folder of this test."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(root) in (entry / "cmdline").read_bytes().decode(errors="replace") and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def start_polar_run(tmp_path: Path, tasks: list[dict], env: dict) -> subprocess.Popen:
    """``polar run`` of ``tasks`` in its own process (the worker the tests kill), logging to worker.log."""
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    with (tmp_path / "worker.log").open("w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "polar.cli", "run", str(tmp_path / "tasks.json")],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


def rollouts_by_task(factory) -> dict[str, list[str]]:
    with factory() as db:
        rows = db.execute(sa.select(Task.name, Rollout.id).join(Rollout, Rollout.task_id == Task.id)).all()
    out: dict[str, list[str]] = {}
    for name, rid in rows:
        out.setdefault(name, []).append(rid)
    return out


def assert_taken_over(factory, ids: dict[str, list[str]], calls_before: dict[str, list], takeover) -> None:
    """After the retry: finished harnesses recovered from their exit file with the real reward; running ones launched
    again, COMPLETED with the real reward, their first launch's calls (all made before the takeover) set aside."""
    for rid in ids["finishes"]:
        row = rollout_row(factory, rid)
        # ...and recovered from the launcher's exit file: postrun and evaluate ran, the reward is the real one.
        assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
        assert row.stage_results["run"]["recovered"] and row.stage_results["run"]["exit_code"] == 0
        assert row.stage_timings["run"]["attempts"] == 2 and len(captures(factory, rid)) == 2
    for rid in ids["still-running"]:
        row = rollout_row(factory, rid)
        assert row.status is RolloutStatus.COMPLETED and row.reward == 1.0, (row.status, row.error)
        relaunched = row.stage_results["run"]["relaunched"]
        assert relaunched["launch"] == 1 and relaunched["reason"] and not relaunched["leftover_killed"]
        old = calls_before[rid]
        assert relaunched["captures_set_aside"] == len(old) and relaunched["seq_end"] == len(old)
        calls = captures(factory, rid)
        assert [c.id for c in calls[: len(old)]] == [c.id for c in old]  # none lost, none added to the old launch
        assert all(c.created_at < takeover and c.status is CaptureStatus.INTERRUPTED for c in calls[: len(old)])
        new = calls[len(old) :]
        assert new and all(c.created_at > takeover and c.status is CaptureStatus.OK for c in new)
        assert [c.seq for c in calls] == list(range(len(calls)))
        built = trajectories(factory, rid)
        assert built and {i for t in built for i in t.capture_ids} == {c.id for c in new}  # never the old ones


async def test_kill_9_of_a_worker_mid_batch_loses_no_finished_harness(worker_env, tmp_path, postgres_url):
    gate = tmp_path / "hold-harness"
    gate.touch()
    solve = {"type": "scripted", "replies": [bash(f"while [ -f {gate} ]; do sleep 0.1; done; echo polar > answer.txt")]}
    solve["replies"].append({"content": "Done."})
    # Blocks until the test lets it go (after the kill): it dies with its worker, and only its relaunch finishes.
    hold = tmp_path / "hold-busy"
    hold.touch()
    busy = script(f"while [ -f {hold} ]; do sleep 0.1; done; echo polar > answer.txt")
    agent = {"name": "agent", "config": {"max_turns": 500}}
    tasks = [
        answer_task(name="finishes", samples=3, policies=[solve], harness=agent),
        answer_task(name="still-running", samples=2, policies=[busy], harness=agent),
    ]
    worker = start_polar_run(tmp_path, tasks, worker_env)
    factory = store_factory()

    try:
        ids = wait_for(
            lambda: (r := rollouts_by_task(factory)) and sum(map(len, r.values())) == 5 and r,
            120,
            "the batch's rollouts",
        )
        everyone = ids["finishes"] + ids["still-running"]
        wait_for(lambda: all(captures(factory, rid) for rid in everyone), 180, "every harness's first call")
        # Freeze the worker, then let the finished ones' harnesses end: the worker cannot record their end.
        worker.send_signal(signal.SIGSTOP)
        gate.unlink()
        exits = [Path(worker_env["POLAR_RUNTIME_ROOT"]) / rid / ".polar" / EXIT_FILE for rid in ids["finishes"]]
        wait_for(lambda: all(p.exists() for p in exits), 120, "the finished harnesses' exit files")
        running = {
            rid: rollout_row(factory, rid).stage_results["progress"]["run"]["process"]["pid"]
            for rid in ids["still-running"]
        }
        assert all(alive(pid) for pid in running.values())
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        gate.unlink(missing_ok=True)

    # The dead worker's harnesses died with it (parent-death signal, then the launcher kills its group).
    root = Path(worker_env["POLAR_RUNTIME_ROOT"])
    wait_for(lambda: not any(alive(pid) for pid in running.values()), 30, "the running harnesses to die")
    wait_for(lambda: not launchers_under(root), 30, "no process left in the runtimes")
    for rid in ids["finishes"]:
        assert "ended" not in rollout_row(factory, rid).stage_results["progress"]["run"]  # the end was lost...
    calls_before = {rid: captures(factory, rid) for rid in ids["still-running"]}
    hold.unlink()  # the still-running ones, launched again, go through

    await wait_out_staleness()  # Prefect still has the dead worker's flow runs Running
    takeover = now()
    result = await retry_failed(stale_after_s=0)
    assert set(everyone) <= set(result["retried"])
    assert_taken_over(factory, ids, calls_before, takeover)
    assert not launchers_under(root)
