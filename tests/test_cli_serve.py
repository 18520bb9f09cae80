"""``polar serve`` as a user runs it, beside ``polar run`` on the same store: one runner per task, each rollout run
once, and one Prefect temporary server per process, gone when the process is."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from db import make_engine
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout, Task
from tests.rollout.helpers import FAIL, SOLVE, answer_task, script
from tests.test_cli import _alive, _descendants, _wait

TOKEN = "serve-test-token-0123456789abcdef"
PREFECT_SERVER = "prefect.server.api.server:create_app"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prefect_servers(pid: int) -> list[int]:
    return [child for child, command in _descendants(pid).items() if PREFECT_SERVER in command]


@pytest.fixture(scope="module")
def serve(tmp_path_factory, cache_dir: Path, tiny_model_dir) -> Iterator[tuple[subprocess.Popen, str, dict[str, str]]]:
    """``polar serve`` on a fresh POLAR_HOME in Prefect's ephemeral mode, inline dispatch, polling every 0.1 s;
    one per module (its start-up is most of these tests' time), the SIGTERM test, which ends it, last."""
    tmp_path = tmp_path_factory.mktemp("serve")
    env = {
        **os.environ,
        "POLAR_HOME": str(tmp_path / "home"),
        "POLAR_CACHE": str(cache_dir),
        "POLAR_CONTROL_TOKEN": TOKEN,
        "POLAR_API_POLL_S": "0.1",
        "POLAR_ALLOW_SCRIPTED_POLICIES": "1",
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("POLAR_TASK_DISPATCH", None)
    url = f"http://127.0.0.1:{_free_port()}"
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "polar.cli", "serve", "--port", url.rsplit(":", 1)[1]],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the teardown can end whatever a failed test left
        )

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _wait(up, 240, "polar serve to answer /health")
        yield proc, url, env
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _post(url: str, tasks: list[dict]) -> list[dict]:
    reply = httpx.post(f"{url}/v1/tasks", json={"tasks": tasks}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 201, reply.text
    return reply.json()["tasks"]


def test_polar_run_and_polar_serve_on_one_store_run_each_rollout_once(serve, tmp_path: Path):
    """The same tasks go to ``polar run`` and, while it runs, to the ``polar serve`` on its store: each runner
    starts only its own tasks, and the store counts one claim and one harness launch per rollout."""
    proc, url, env = serve
    tasks = [answer_task(name="one", policies=[SOLVE, FAIL]), answer_task(name="two", policies=[FAIL, SOLVE])]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    run = subprocess.Popen(
        [sys.executable, "-m", "polar.cli", "run", str(tmp_path / "tasks.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        posted = _post(url, tasks)
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, out
    assert "RolloutClaimed" not in out and "not run to a final status" not in out, out
    assert "4 rollouts: COMPLETED 4" in out, out

    engine = make_engine(f"sqlite:///{Path(env['POLAR_HOME']) / 'polar.db'}")
    try:

        def finished() -> bool:
            with engine.connect() as db:
                statuses = db.scalars(sa.select(Rollout.status)).all()
            return len(statuses) == 8 and all(RolloutStatus(s).is_terminal for s in statuses)

        _wait(finished, 120, "polar serve's rollouts to finish")
        with engine.connect() as db:
            holders = dict(db.execute(sa.select(Task.id, Task.dispatcher)).all())
            rollouts = db.execute(sa.select(Rollout.id, Rollout.status, Rollout.attempt, Rollout.stage_timings)).all()
            calls = dict(
                db.execute(
                    sa.select(Capture.rollout_id, sa.func.count())
                    .where(Capture.status == CaptureStatus.OK)
                    .group_by(Capture.rollout_id)
                ).all()
            )
    finally:
        engine.dispose()
    api_tasks = {t["task_id"] for t in posted}
    assert len(holders) == 4 and api_tasks <= set(holders)
    assert all(holders[t].startswith("api:") for t in api_tasks)  # polar serve ran what was posted to it ...
    assert all(h.startswith("batch:") for t, h in holders.items() if t not in api_tasks)  # ... polar run its own
    assert len({h for t, h in holders.items() if t not in api_tasks}) == 1
    assert [r.status for r in rollouts] == [RolloutStatus.COMPLETED] * 8
    assert {r.id: r.attempt for r in rollouts} == {r.id: 1 for r in rollouts}  # one claim each ...
    assert {r.id: r.stage_timings["run"]["attempts"] for r in rollouts} == {r.id: 1 for r in rollouts}  # one launch
    assert calls == {r.id: 2 for r in rollouts}  # ... and one harness's calls: a tool call and the final answer
    assert len(_prefect_servers(proc.pid)) == 1  # polar serve's flows all used its one temporary server


def test_sigterm_stops_polar_serve_and_its_prefect_server(serve):
    """SIGTERM to ``polar serve`` with a rollout mid-run: it exits, and the one Prefect temporary server it
    started, and the harness, stop with it."""
    proc, url, _ = serve
    assert len(_prefect_servers(proc.pid)) == 1  # started with the process, before any flow
    _post(url, [answer_task(name="long", samples=1, policies=[script("sleep 300")])])
    started = _wait(
        lambda: (d := _descendants(proc.pid)) and any("polar-launcher" in c for c in d.values()) and d,
        120,
        "the harness to start",
    )
    assert len([c for c in started.values() if PREFECT_SERVER in c]) == 1, list(started.values())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    left = lambda: [pid for pid in started if _alive(pid)]  # noqa: E731
    _wait(lambda: not left(), 60, f"the started processes to stop: {[started[p] for p in left()]}")
