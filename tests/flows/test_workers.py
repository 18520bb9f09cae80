"""Scale-out as deployed: a Prefect server on Postgres (its own database), ``prefect deploy --all`` from the
repository's prefect.yaml, and two process workers (separate processes) on one work pool sharing one batch.
Every rollout runs exactly once, both workers take part, and the fleet-wide run limit holds across them; a stage
slot's holder killed with ``kill -9`` gives its slot back once its lease has run out, while a live holder's lease
is renewed.

Every process is started and stopped here by its PID; Prefect's state lives in a temporary PREFECT_HOME."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import make_url

from db.enums import RolloutStatus
from db.models import Rollout, Task
from polar.proxy.embedded import EmbeddedGateway
from polar.rollout.context import close_contexts, store_factory
from polar.settings import Settings
from tests.flows.conftest import polar_environment
from tests.pg import POSTGRES_URL, needs_postgres
from tests.rollout.conftest import postgres_url, start_gateway  # noqa: F401
from tests.rollout.helpers import answer_task, captures

pytestmark = needs_postgres

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
SFT_DEPLOYMENT = "polar-sft-generation/sft-generation"
POOL = "polar-process"  # the pool prefect.yaml names


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen, *, worker: bool = False) -> None:
    """Stop a process we started. A Prefect worker needs SIGINT twice (see infra notes); then it is killed."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT if worker else signal.SIGTERM)
    try:
        process.wait(timeout=3)
        return
    except subprocess.TimeoutExpired:
        pass
    if worker:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            pass
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def prefect_database() -> Iterator[str]:
    """A database of its own for Prefect (never the store's: both keep an alembic_version table)."""
    base = make_url(POSTGRES_URL)
    name = f"polar_prefect_{uuid.uuid4().hex[:10]}"
    admin = base.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(drivername="postgresql+asyncpg", database=name, query={}).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory, prefect_database) -> Iterator[dict[str, str]]:
    """A Prefect server on Postgres; yields the environment that points Prefect clients at it."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        # Host and port through the environment, not CLI flags, so the server describes its own URL correctly.
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": prefect_database,
        "PREFECT_LOGGING_LEVEL": "INFO",
        # The scheduler turns deployment schedules into runs; once a second, so a scheduled test need not wait.
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        # The repossessor frees the slots of expired leases (a killed holder's); once a second here.
        "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "1",
    }
    log = (home / "server.log").open("w")
    server = subprocess.Popen([PREFECT, "server", "start"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(api + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not start: {(home / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        client_env = {k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_")}
        yield {**client_env, "PREFECT_API_URL": api}
    finally:
        stop(server)
        log.close()


def prefect_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PREFECT, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, cache_dir, postgres_url, engine) -> Iterator[EmbeddedGateway]:
    gw = start_gateway(tmp_path_factory.mktemp("gw"), cache_dir, postgres_url, engine)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def deployed(prefect_env) -> dict[str, str]:
    """The repository's deployments on the server (``prefect deploy --all``) and its process work pool."""
    prefect_cli(prefect_env, "work-pool", "create", POOL, "--type", "process")
    deployed = prefect_cli({**prefect_env, "POLAR_REPO_DIR": str(REPO)}, "--no-prompt", "deploy", "--all")
    for name in (
        "polar-rollout/rollout",
        "polar-batch/batch",
        "polar-retry-failed/retry-failed",
        "polar-rebuild-trajectories/rebuild-trajectories",
    ):
        assert name in deployed, deployed
    return prefect_env


def start_worker(env: dict[str, str], index: int, log) -> subprocess.Popen:
    command = [PREFECT, "worker", "start", "--pool", POOL, "--name", f"worker-{index}", "--limit", "2"]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_two_workers_share_one_batch_and_run_every_rollout_once(deployed, gateway, postgres_url, tmp_path, cache_dir):
    polar = polar_environment(
        tmp_path, cache_dir, postgres_url, gateway.url, POLAR_STAGE_LIMITS="prefect", POLAR_RUN_CONCURRENCY="2"
    )
    env = {**deployed, **polar, "POLAR_REPO_DIR": str(REPO), "PREFECT_WORKER_QUERY_SECONDS": "1"}

    workers, logs = [], []
    try:
        for index in (1, 2):
            log = (tmp_path / f"worker-{index}.log").open("w")
            logs.append(log)
            workers.append(start_worker(env, index, log))
        tag = uuid.uuid4().hex[:8]
        tasks = [answer_task(name=f"shared-{tag}", samples=6)]
        # The batch runs on one worker and dispatches each rollout as a deployment run onto the pool.
        prefect_cli(env, "deployment", "run", "polar-batch/batch", "--param", f"tasks={json.dumps(tasks)}")
        factory = _store(postgres_url)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            rows = _rollouts(factory, f"shared-{tag}")
            if len(rows) == 6 and all(RolloutStatus(r.status).is_terminal for r in rows):
                break
            assert all(w.poll() is None for w in workers), "a worker died"
            time.sleep(1)
        else:
            raise AssertionError(f"the batch did not finish: {[r.status for r in _rollouts(factory, f'shared-{tag}')]}")
    finally:
        for worker in workers:
            stop(worker, worker=True)
        for log in logs:
            log.close()

    rows = _rollouts(factory, f"shared-{tag}")
    assert [r.status for r in rows] == [RolloutStatus.COMPLETED] * 6
    assert sorted(r.reward for r in rows) == [0.0] * 3 + [1.0] * 3
    # Each rollout ran once: one claim, each stage once, one session's worth of captures.
    assert all(r.attempt == 1 for r in rows)
    assert all(t["attempts"] == 1 for r in rows for t in r.stage_timings.values())
    assert all(len(captures(factory, r.id)) == 2 for r in rows)
    # Each rollout was its own flow run, started by one of the two workers, and both took part.
    flow_runs = {r.flow_run_id for r in rows}
    assert len(flow_runs) == 6
    ran_by = {r.stage_timings["run"]["where"]["ppid"] for r in rows}
    assert ran_by == {w.pid for w in workers}, (ran_by, [w.pid for w in workers])
    # The fleet-wide run limit (2) held across both workers.
    spans = sorted((r.stage_timings["run"]["started_at"], r.stage_timings["run"]["finished_at"]) for r in rows)
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) <= 2


def _store(url: str):
    return store_factory(Settings(database_url=url))


def _rollouts(factory, task_name: str) -> list[Rollout]:
    with factory() as db:
        return list(
            db.scalars(
                sa.select(Rollout)
                .join(Task, Rollout.task_id == Task.id)
                .where(Task.name == task_name)
                .order_by(Rollout.sample_index)
            )
        )


@pytest.fixture(scope="module", autouse=True)
def _close_contexts() -> Iterator[None]:
    yield
    close_contexts()


def test_the_control_api_runs_tasks_as_pool_flow_runs_and_cancels_them(
    deployed,
    gateway,
    postgres_url,
    tmp_path,
    cache_dir,
):
    """``polar serve`` with a Prefect server configured: a task's rollouts become runs of the rollout deployment
    that a worker picks up; the task view shows their flow-run states; cancelling stops a running one."""
    from polar.client import PolarClient

    port = free_port()
    polar = polar_environment(
        tmp_path, cache_dir, postgres_url, gateway.url, POLAR_API_PORT=str(port), POLAR_API_POLL_S="0.2"
    )
    env = {**deployed, **polar, "POLAR_REPO_DIR": str(REPO), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    worker_log, api_log = (tmp_path / "worker.log").open("w"), (tmp_path / "api.log").open("w")
    worker = start_worker(env, 3, worker_log)
    api = subprocess.Popen(
        [str(Path(sys.executable).parent / "polar"), "serve"],
        env=env,
        cwd=tmp_path,
        stdout=api_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert api.poll() is None and time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-2000:]
            time.sleep(0.3)
        with PolarClient(url) as client:
            assert client.health()["dispatch"] == "deployment"
            tag = uuid.uuid4().hex[:8]
            [task_id] = client.submit([answer_task(name=f"api-{tag}", samples=2)])
            [view] = client.wait([task_id], timeout_s=240)
            assert view["status"] == "COMPLETED" and sorted(r["reward"] for r in view["rollouts"]) == [0.0, 1.0]
            # A rollout is COMPLETED just before its flow run reports its own end.
            deadline = time.monotonic() + 30
            while not all(r["flow_run_id"] and r["flow_run_state"] == "Completed" for r in view["rollouts"]):
                assert time.monotonic() < deadline, view["rollouts"]
                time.sleep(0.5)
                view = client.task(task_id)

            sleeper = answer_task(
                name=f"sleep-{tag}",
                samples=1,
                policies=None,
                timeout_s=300,
                harness={"name": "command", "config": {"command": "sleep 120"}},
            )
            [sleeping] = client.submit([sleeper])
            deadline = time.monotonic() + 120
            while client.task(sleeping)["counts"].get("RUNNING") != 1:
                assert time.monotonic() < deadline, client.task(sleeping)
                time.sleep(0.5)
            assert client.cancel(sleeping)["status"] == "CANCELLED"
            deadline = time.monotonic() + 60
            while (state := client.task(sleeping)["rollouts"][0]["flow_run_state"]) != "Cancelled":
                assert time.monotonic() < deadline, state
                time.sleep(0.5)
            assert client.task(sleeping)["counts"] == {"CANCELLED": 1}
    finally:
        stop(api)
        stop(worker, worker=True)
        worker_log.close()
        api_log.close()


def test_a_scheduled_sft_run_exports_rows_that_round_trip(deployed, gateway, postgres_url, tmp_path, cache_dir):
    """The sft-generation deployment on a schedule: the server's scheduler creates the run, a worker runs it, and
    the parquet it writes holds the store's accepted conversations (messages and token arrays)."""
    import asyncio
    from datetime import timedelta

    import pyarrow.parquet as pq
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from db.models import Trajectory
    from tests.rollout.helpers import FAIL, SOLVE

    rows = [
        {"id": "solved", "instruction": "Write polar into answer.txt.", "policies": [SOLVE]},
        {"id": "failed", "instruction": "Write polar into answer.txt.", "policies": [FAIL]},
    ]
    dataset = tmp_path / "sft.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = f"sched-{uuid.uuid4().hex[:8]}"
    parameters = {
        "dataset": str(dataset),
        "name": name,
        "harness": {"name": "agent", "config": {"max_turns": 4}},
        "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
        "samples_per_task": 1,
        "output": str(tmp_path / "exports"),
        # The dataset's replies are scripted (a random tiny teacher solves nothing): exported only when asked.
        "acceptance": {"min_reward": 1.0, "include_scripted": True},
    }

    async def with_client(action):
        with temporary_settings({PREFECT_API_URL: deployed["PREFECT_API_URL"]}):
            async with get_client() as client:
                return await action(client)

    async def schedule(client):
        deployment = await client.read_deployment_by_name(SFT_DEPLOYMENT)
        # `prefect deploy --all` left the shipped daily schedule off; this test turns on one of its own.
        shipped = await client.read_deployment_schedules(deployment.id)
        assert shipped and not any(item.active for item in shipped)
        await client.update_deployment(deployment.id, DeploymentUpdate(parameters=parameters))
        await client.create_deployment_schedules(
            deployment.id, [(IntervalSchedule(interval=timedelta(seconds=10)), True)]
        )
        return deployment.id

    # docs/exports.md's way to turn the shipped daily run on, as typed: list its id, resume it (then off again).
    wide = {**deployed, "COLUMNS": "240"}  # the table prints whole ids
    listed = prefect_cli(wide, "deployment", "schedule", "ls", SFT_DEPLOYMENT)
    [daily] = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", listed)
    prefect_cli(wide, "deployment", "schedule", "resume", SFT_DEPLOYMENT, daily)

    async def daily_active(client):
        deployment = await client.read_deployment_by_name(SFT_DEPLOYMENT)
        return {str(s.id): s.active for s in await client.read_deployment_schedules(deployment.id)}[daily]

    assert asyncio.run(with_client(daily_active))
    prefect_cli(wide, "deployment", "schedule", "pause", SFT_DEPLOYMENT, daily)

    deployment_id = asyncio.run(with_client(schedule))
    polar = polar_environment(tmp_path, cache_dir, postgres_url, gateway.url)
    env = {**deployed, **polar, "POLAR_REPO_DIR": str(REPO), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    log = (tmp_path / "worker.log").open("w")
    worker = start_worker(env, 4, log)

    async def finished_runs(client):
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
        return [r for r in runs if r.state is not None and r.state.is_final()]

    async def pause(client):
        for item in await client.read_deployment_schedules(deployment_id):
            await client.update_deployment_schedule(deployment_id, item.id, active=False)

    try:
        deadline = time.monotonic() + 240
        while not (done := asyncio.run(with_client(finished_runs))):
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(1)
        asyncio.run(with_client(pause))
    finally:
        stop(worker, worker=True)
        log.close()
    run = done[0]
    assert run.auto_scheduled and run.state.is_completed(), run.state
    [parquet] = sorted((tmp_path / "exports").glob(f"{name}-*.parquet"))[:1]
    exported = pq.read_table(parquet).to_pylist()
    factory = _store(postgres_url)
    with factory() as db:
        solved = db.execute(
            sa.select(Trajectory, Task.meta)
            .join(Rollout, Rollout.id == Trajectory.rollout_id)
            .join(Task, Task.id == Rollout.task_id)
            .where(Task.name == f"{name}:solved", Trajectory.reward >= 1, Trajectory.builder == "prefix_merge")
        ).all()
    # The run's own accepted conversations (a second scheduled run may have started before the first accepted any).
    accepted = [t for t, meta in solved if meta["sft_run"] == str(run.id)]
    assert len(exported) == len(accepted) == 1
    row, stored = exported[0], accepted[0]
    assert row["trajectory_id"] == stored.id and json.loads(row["metadata"])["sft_key"] == "solved"
    assert row["prompt_ids"] == list(stored.prompt_ids) and row["response_ids"] == list(stored.response_ids)
    assert row["loss_mask"] == list(stored.loss_mask)
    calls = [c for m in row["messages"] if m["tool_calls"] for c in m["tool_calls"]]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"command": "echo polar > answer.txt"}]
    assert row["messages"][-1]["role"] == "assistant" and row["messages"][-1]["content"] == "Done."


HOLDER = """
import asyncio, sys
from polar.prefect_adapter import PrefectLimiter, ensure_limits
from polar.settings import Settings

async def main():
    settings = Settings()
    await ensure_limits(settings)
    async with PrefectLimiter(settings).slot("run"):
        print("held", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # until the test closes stdin (or kills this process)

asyncio.run(main())
"""


def _run_slots(api: str) -> int:
    return httpx.get(f"{api}/v2/concurrency_limits/polar-run", timeout=10).json()["active_slots"]


def test_a_killed_holders_stage_slot_comes_back_after_its_lease(prefect_env, tmp_path):
    lease_s = 60  # POLAR_LIMIT_LEASE_S's default: the least the Prefect server accepts
    env = {
        **prefect_env,
        "POLAR_HOME": str(tmp_path),
        "POLAR_RUN_CONCURRENCY": "2",
        "POLAR_LIMIT_LEASE_S": str(lease_s),
    }
    api = prefect_env["PREFECT_API_URL"]
    holders = []
    try:
        for _ in range(2):
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER], env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            holders.append(holder)
        live, killed = holders
        assert _run_slots(api) == 2
        killed.kill()  # kill -9: nothing released, nothing renewed
        killed.wait()
        gone = time.monotonic()
        while _run_slots(api) == 2:
            assert time.monotonic() - gone < lease_s + 30, "the killed holder's slot never came back"
            time.sleep(0.5)
        freed_after = time.monotonic() - gone
        # The live holder acquired its slot before the killed one: its first lease has run out by now, but it was
        # renewed (every 3/4 of the lease), so its slot is still held.
        for _ in range(6):
            assert _run_slots(api) == 1
            time.sleep(0.5)
        print(f"\nkilled holder's slot free {freed_after:.1f} s after kill -9 (lease {lease_s} s)")
        assert live.stdin is not None
        live.stdin.close()  # the live holder leaves its block: the slot is released at once
        assert live.wait(timeout=30) == 0
        assert _run_slots(api) == 0
    finally:
        for holder in holders:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            for pipe in (holder.stdin, holder.stdout):
                if pipe is not None:
                    pipe.close()
