"""Kill -9 of a worker mid-batch in the docker runtime (``polar run``, Postgres): the docker case of
tests/flows/test_worker_death.py. The rollouts whose harness had finished end COMPLETED with their real reward
after the retry (the launcher's exit file is on the host, in the bind-mounted runtime folder), the containers of
the dead worker stop with it (so do the harnesses still running in them), none of its harnesses makes a call
after the takeover, the label-based reaper removes the stopped containers, the harnesses cut short are launched
again in new containers and end COMPLETED with their real reward (their first launch's captures set aside), and
no container or process is left.

The harness is a small stdlib client (the image has ``python3``, not the OpenAI SDK): the finishing ones call
twice, then wait for a ``go`` file the test writes into their folder and write the answer; the others call every
0.2 s until the test writes their ``go`` file, which it does only once they are launched again. The window between
"the harness exited" and "the end is recorded" is held open by locking the finished rollouts' rows once their
calls are in (the worker's writes wait on them, and so would their captures: the writer advances each rollout's
seq counter)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from db.engine import make_engine
from db.models import Rollout
from flows.retry import retry_failed
from polar.clock import now
from polar.rollout.context import close_contexts, store_factory
from polar.runtime.docker_engine import LABEL
from polar.runtime.launcher import EXIT_FILE
from polar.runtime.reaper import reap_orphans
from polar.settings import get_settings
from tests.flows.conftest import polar_environment, prefect_server, wait_out_staleness  # noqa: F401
from tests.flows.test_worker_death import (  # noqa: F401
    assert_taken_over,
    launchers_under,
    pg_gateway,
    rollouts_by_task,
    start_polar_run,
    wait_for,
)
from tests.pg import needs_postgres
from tests.rollout.conftest import postgres_url  # noqa: F401
from tests.rollout.helpers import GIT_INIT, answer_task, captures, rollout_row
from tests.runtime.conftest import IMAGE, tools_dir

pytestmark = needs_postgres
REPO = Path(__file__).resolve().parents[2]

CLIENT = """\
import json, os, sys, time, urllib.request

def call():
    body = {"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "Go on."}], "max_tokens": 4}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        json.load(reply)

call()
if sys.argv[1] == "finish":
    call()  # before the window the test holds open by locking this rollout's row (captures wait on it)
    while not os.path.exists("go"):
        time.sleep(0.1)
    with open("answer.txt", "w") as f:
        f.write("polar\\n")
else:
    while not os.path.exists("go"):
        time.sleep(0.2)
        call()
    with open("answer.txt", "w") as f:
        f.write("polar\\n")
"""


def release_relaunched(factory, root: Path, rollout_ids: list[str], timeout_s: float = 300) -> None:
    """Write the ``go`` file of each rollout once its harness is launched again (its runtime was prepared afresh
    just before, which is why the file cannot be written earlier)."""
    waiting, deadline = set(rollout_ids), time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for rid in list(waiting):
            results = rollout_row(factory, rid).stage_results
            if results.get("interrupted_runs") and (results.get("progress") or {}).get("run", {}).get("launched_at"):
                (root / rid / "work" / "go").touch()
                waiting.discard(rid)
        time.sleep(0.1)


def docker_task(name: str, samples: int, mode: str) -> dict:
    harness = {"name": "command", "config": {"command": f"python3 client.py {mode}", "files": {"client.py": CLIENT}}}
    runtime = {"type": "docker", "prepare": [{"command": GIT_INIT}]}
    policy = {"type": "scripted", "replies": []}  # the client offers no tools: every call gets the tool-free reply
    return answer_task(name=name, samples=samples, policies=[policy], harness=harness, runtime=runtime)


def containers_under(engine, root: Path) -> list:
    return [
        c
        for c in engine.containers.list(all=True, filters={"label": LABEL})
        if Path(c.labels.get("polar.root", "/")).is_relative_to(root)
    ]


@pytest.fixture
def worker_env(monkeypatch, tmp_path, cache_dir, postgres_url, pg_gateway, prefect_server) -> Iterator[dict]:
    env = polar_environment(
        tmp_path,
        cache_dir,
        postgres_url,
        pg_gateway.url,
        POLAR_TOOLS=str(tools_dir()),
        POLAR_DOCKER_IMAGE=IMAGE,
    )
    env.update(PREFECT_API_URL=prefect_server, POLAR_RUN_CONCURRENCY="8", POLAR_BATCH_MAX_ACTIVE="8")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield env
    close_contexts()
    get_settings.cache_clear()


async def test_kill_9_of_a_docker_worker_mid_batch_loses_no_finished_harness(
    docker_engine,
    no_leaks,
    worker_env,
    tmp_path,
    postgres_url,
):
    tasks = [docker_task("finishes", 3, "finish"), docker_task("still-running", 3, "busy")]
    worker = start_polar_run(tmp_path, tasks, worker_env)
    factory = store_factory()
    root = Path(worker_env["POLAR_RUNTIME_ROOT"])

    try:
        ids = wait_for(
            lambda: (r := rollouts_by_task(factory)) and sum(map(len, r.values())) == 6 and r,
            120,
            "the batch's rollouts",
        )
        everyone = ids["finishes"] + ids["still-running"]
        wait_for(lambda: all(captures(factory, rid) for rid in everyone), 180, "every harness's first call")
        wait_for(lambda: all(len(captures(factory, rid)) == 2 for rid in ids["finishes"]), 180, "the finishers' calls")
        # Hold the finished ones' rows, then let their harnesses finish: the worker cannot record their end.
        lock_engine = make_engine(postgres_url)
        try:
            with lock_engine.connect() as lock:
                lock.execute(
                    sa.select(Rollout.id).where(Rollout.id.in_(ids["finishes"])).with_for_update(key_share=True)
                ).all()
                for rid in ids["finishes"]:
                    (root / rid / "work" / "go").touch()
                exits = [root / rid / ".polar" / EXIT_FILE for rid in ids["finishes"]]
                wait_for(lambda: all(p.exists() for p in exits), 120, "the finished harnesses' exit files")
                assert all("process" in rollout_row(factory, rid).stage_results["progress"]["run"] for rid in everyone)
                assert {c.name for c in containers_under(docker_engine, root) if c.status == "running"} == {
                    f"polar-{rid}" for rid in everyone
                }
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                lock.rollback()
        finally:
            lock_engine.dispose()  # also when an assertion fails: no connection left to the collector
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    # The dead worker's containers stopped with it, and with them every harness still running in them.
    wait_for(
        lambda: all(c.status != "running" for c in containers_under(docker_engine, root)), 30, "the containers to stop"
    )
    wait_for(lambda: not launchers_under(root), 30, "no process left in the runtimes")
    for rid in ids["finishes"]:
        assert "ended" not in rollout_row(factory, rid).stage_results["progress"]["run"]  # the end was lost...
        assert (root / rid / ".polar" / EXIT_FILE).exists()  # ...but not the launcher's record of it
    # The label-based reaper takes stopped containers (nothing of theirs is lost: their files are on the host).
    reaped = reap_orphans(root=root)
    assert {r.name for r in reaped} == {f"polar-{rid}" for rid in everyone}
    assert containers_under(docker_engine, root) == []
    calls_before = {rid: captures(factory, rid) for rid in ids["still-running"]}

    await wait_out_staleness()  # Prefect still has the killed flow run Running
    takeover = now()
    release = threading.Thread(target=release_relaunched, args=(factory, root, ids["still-running"]), daemon=True)
    release.start()
    result = await retry_failed(stale_after_s=0)
    release.join(timeout=5)
    assert set(everyone) <= set(result["retried"])
    assert_taken_over(factory, ids, calls_before, takeover)
    assert not launchers_under(root)
    assert containers_under(docker_engine, root) == []
