"""A cluster in network namespaces: a database host (a Postgres started here, holding the store and Prefect's
database, and the Prefect server), two inference hosts (``polar serve-model``), two worker hosts (each a Prefect
worker and a gateway replica), and a load-balancer host (HAProxy, deploy/haproxy.cfg).

One batch of 48 rollouts of the built-in tool-using agent runs over both worker hosts (two halves of it, one
batch flow run per worker) and both gateway replicas (HAProxy balances round-robin here, so the calls of one
session hit either replica: replicas must not need affinity). Scripted sessions decide what the agent does (their
reward is known); model sessions sample from the tiny model through the inference fleet (POLAR_BACKEND_URL lists
both servers). Mid-batch one inference server is killed (kill -9): its sessions move to the other, and every
rollout still finishes. Then one worker host loses every process (worker, flow process, harnesses, gateway):
the retry flow, on the other host, resumes its rollouts at the stage that failed (the runtime root is on storage
both hosts share, as an NFS mount would be); a harness cut short mid-run is not launched again and ends ERROR.
Each worker host counts its own stage limits (``POLAR_STAGE_LIMITS=process``): with Prefect's fleet-wide
limits, the slots a killed host held stay leased for Prefect's default 300 s and would stall the other host.

Everything is started here by PID and stopped by PID; the namespaces are deleted at the end, even on failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.capture_tree import full_prompt_ids
from db.engine import make_engine
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout, Task
from polar.backends.base import GenerateRequest
from polar.backends.fleet import FleetBackend, Member
from polar.errors import StoreError
from tests.cluster.hosts import SUBNET, Network, in_namespace, missing_tools, postgres_bin, wait_for
from tests.rollout.helpers import GIT_INIT, bash

# CI installs what the test needs (make tools): there a missing tool is a failure, not a skip.
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(missing_tools() is not None and os.environ.get("CI") != "true", reason=str(missing_tools())),
]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTS = ["db", "inf1", "inf2", "w1", "w2", "lb"]
POOL = "polar-process"
STALE_AFTER_S = 15
PER_BATCH = {"solve": 8, "fail": 8, "model": 8}  # x2 batches = 48 rollouts
RUN_LIMIT = 6  # harnesses at once per worker host


@dataclass
class Cluster:
    net: Network
    root: Path
    store_url: str  # the test's own way in: Postgres's unix socket (no address outside the namespaces)
    engine: sa.Engine
    prefect_api: str
    lb_log: Path
    inference: dict[str, str]  # host -> URL

    def env(self, host: str, **extra: str) -> dict[str, str]:
        home = self.root / host
        home.mkdir(exist_ok=True)
        return prefect_env(home, **extra)

    def prefect(self, *args: str, host: str = "db", timeout_s: float = 180) -> str:
        env = self.env(host, PREFECT_API_URL=self.prefect_api, POLAR_REPO_DIR=str(REPO))
        code, out = self.net.run(host, [str(BIN / "prefect"), *args], env=env, timeout_s=timeout_s)
        assert code == 0, f"prefect {' '.join(args)} failed:\n{out}"
        return out

    def flow_run_state(self, flow_run_id: str) -> str:
        url = f"{self.prefect_api}/flow_runs/{flow_run_id}"
        body = in_namespace(self.net.hosts["db"].netns, lambda: httpx.get(url, timeout=10).json())
        return str((body.get("state") or {}).get("type"))  # type: ignore[union-attr]


def prefect_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "POLAR_"))}
    env.update(
        PYTHONPATH=str(REPO),
        PREFECT_HOME=str(home / "prefect"),
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        POLAR_CONTROL_TOKEN=os.environ.get("POLAR_CONTROL_TOKEN", "cluster-control"),
    )
    env.update(extra)
    return env


def haproxy_config(logs: Path) -> Path:
    """deploy/haproxy.cfg as shipped, but balancing round-robin (no affinity: a session's calls hit either replica)
    and logging each request's server and session key, which is how the test sees which replica served a call."""
    text = (REPO / "deploy" / "haproxy.cfg").read_text()
    assert "balance hash var(txn.session_key)" in text
    text = text.replace("balance hash var(txn.session_key)", "balance roundrobin")
    text = text.replace(
        "frontend polar_gateway\n",
        "frontend polar_gateway\n    http-request capture req.hdr(authorization) len 120\n"
        '    log-format "POLAR %s %[capture.req.hdr(0)]"\n',
    )
    path = logs / "haproxy.cfg"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, cache_dir, tiny_model_dir) -> Iterator[Cluster]:
    began = time.monotonic()
    root = tmp_path_factory.mktemp("cluster")
    logs = root / "logs"
    logs.mkdir()
    # Postgres runs as its own user: its folder must be outside pytest's root-only tmp tree.
    pg_root = Path(tempfile.mkdtemp(prefix="polar-cluster-pg-"))
    pg_root.chmod(0o755)
    shutil.chown(pg_root, "postgres", "postgres")
    net = Network(HOSTS, logs)
    engine: sa.Engine | None = None
    try:
        db = net.address("db")
        pgbin = postgres_bin()
        assert pgbin is not None
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(pgbin / "initdb"), "-D", str(pg_root / "data"), "-U", "postgres"]
            + ["--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with (pg_root / "data" / "pg_hba.conf").open("a") as hba:  # the hosts of this test's network only
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        settings = ["fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=300"]
        net.start(
            "db",
            [str(pgbin / "postgres"), "-D", str(pg_root / "data"), "-k", str(pg_root), "-h", db, "-p", "5432"]
            + [arg for s in settings for arg in ("-c", s)],
            env={"PATH": os.environ["PATH"]},
            log="postgres.log",
            user="postgres",
        )
        admin = f"postgresql+psycopg://postgres@/postgres?host={pg_root}&port=5432"
        wait_for(lambda: _connects(admin), 60, "Postgres")
        admin_engine = make_engine(admin, isolation_level="AUTOCOMMIT")
        with admin_engine.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE polar"))
            conn.execute(sa.text("CREATE DATABASE prefect"))
        admin_engine.dispose()
        store_url = f"postgresql+psycopg://postgres@/polar?host={pg_root}&port=5432"
        from db.migrate import upgrade

        upgrade(store_url)
        host_store = f"postgresql+psycopg://postgres@{db}:5432/polar"

        cluster = Cluster(net, root, store_url, make_engine(store_url), f"http://{db}:4200/api", logs / "lb.log", {})
        engine = cluster.engine
        net.start(
            "db",
            [str(BIN / "prefect"), "server", "start"],
            env=cluster.env(
                "db",
                PREFECT_SERVER_API_HOST=db,
                PREFECT_SERVER_API_PORT="4200",
                PREFECT_SERVER_DATABASE_CONNECTION_URL=f"postgresql+asyncpg://postgres@{db}:5432/prefect",
            ),
            log="prefect-server.log",
            cwd=root,
        )
        for name in ("inf1", "inf2"):
            address = net.address(name)
            cluster.inference[name] = f"http://{address}:30000"
            net.start(
                name,
                [sys.executable, "-m", "polar.cli", "serve-model", "--host", address, "--port", "30000"]
                + ["--model-path", str(tiny_model_dir), "--log-level", "warning"],
                env=cluster.env(name, POLAR_CACHE=str(cache_dir)),
                log=f"{name}.log",
                cwd=REPO,
            )
        for name in ("inf1", "inf2"):
            wait_for(lambda n=name: net.http_ok("w1", cluster.inference[n] + "/health"), 120, name, every_s=1)
        fleet_url = ",".join(cluster.inference.values())
        for name in ("w1", "w2"):
            net.start(
                name,
                [sys.executable, "-m", "polar.cli", "gateway", "--host", net.address(name), "--port", "8700"],
                env=cluster.env(
                    name,
                    POLAR_HOME=str(root / name / "home"),
                    POLAR_CACHE=str(cache_dir),
                    POLAR_MODEL_PATH=str(tiny_model_dir),
                    POLAR_DATABASE_URL=host_store,
                    POLAR_BACKEND="sglang",
                    POLAR_BACKEND_URL=fleet_url,
                    POLAR_BACKEND_RETRY_AFTER_S="600",
                    POLAR_ALLOW_SCRIPTED_POLICIES="1",
                ),
                log=f"gateway-{name}.log",
                cwd=REPO,
            )
        lb = net.address("lb")
        net.start(
            "lb",
            ["haproxy", "-db", "-f", str(haproxy_config(logs))],
            env={
                "PATH": os.environ["PATH"],
                "POLAR_LB_BIND": f"{lb}:8700",
                "POLAR_GATEWAY_1": f"{net.address('w1')}:8700",
                "POLAR_GATEWAY_2": f"{net.address('w2')}:8700",
            },
            log="lb.log",
        )
        wait_for(lambda: net.http_ok("db", f"{cluster.prefect_api}/health"), 150, "the Prefect server", every_s=1)
        for name in ("w1", "w2"):
            url = f"http://{net.address(name)}:8700/health/ready"
            wait_for(lambda u=url: net.http_ok("lb", u), 120, f"the gateway on {name}", every_s=1)
        wait_for(lambda: net.http_ok("w1", f"http://{lb}:8700/health/ready"), 30, "HAProxy", every_s=1)

        cluster.prefect("work-pool", "create", POOL, "--type", "process")
        deployed = cluster.prefect("--no-prompt", "deploy", "--all")
        assert "polar-batch/batch" in deployed and "polar-retry-failed/retry-failed" in deployed, deployed
        for name in ("w1", "w2"):
            worker_env = cluster.env(
                name,
                PREFECT_API_URL=cluster.prefect_api,
                PREFECT_WORKER_QUERY_SECONDS="1",
                POLAR_REPO_DIR=str(REPO),
                POLAR_HOME=str(root / name / "home"),
                POLAR_CACHE=str(cache_dir),
                POLAR_DATABASE_URL=host_store,
                POLAR_GATEWAY_URL=f"http://{lb}:8700",
                # On storage both hosts mount (as NFS would be): a stage resumed on the other host finds the folder.
                POLAR_RUNTIME_ROOT=str(root / "shared-runtimes"),
                POLAR_HEARTBEAT_S="1",
                POLAR_STAGE_RETRY_DELAY_S="0",
                # Prefect still shows a killed host's flow run Running: a retry takes its rollouts over only after
                # this much heartbeat silence (a live owner heartbeats every second).
                POLAR_STALE_AFTER_S=str(STALE_AFTER_S),
                POLAR_ALLOW_SCRIPTED_POLICIES="1",
                # Each host's own limits: with fleet-wide Prefect limits, the slots a killed host held stay taken
                # until their leases expire (Prefect's default: 300 s), which would stall the other host that long.
                POLAR_STAGE_LIMITS="process",
                POLAR_RUN_CONCURRENCY=str(RUN_LIMIT),
                POLAR_INIT_CONCURRENCY="6",
                POLAR_POSTRUN_CONCURRENCY="6",
                POLAR_READY_BUFFER="6",
                POLAR_BATCH_MAX_ACTIVE="24",
            )
            # One flow run at a time per worker: each half of the batch lands on its own host.
            command = [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--name", name, "--limit", "1"]
            net.start(name, command, env=worker_env, log=f"worker-{name}.log", cwd=REPO)
        print(f"\ncluster up in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
        yield cluster
    finally:
        if engine is not None:
            engine.dispose()
        # Workers first (their flow processes and harnesses), then what they call, the database last.
        net.close(stop_order=["w1", "w2", "lb", "inf1", "inf2", "db"])
        shutil.rmtree(pg_root, ignore_errors=True)


def _connects(url: str) -> bool:
    probe = make_engine(url)
    try:
        with probe.connect():
            return True
    except (sa.exc.OperationalError, StoreError):  # the store's engine names a refused connection a StoreError
        return False
    finally:
        probe.dispose()


def tasks(tag: str) -> list[dict]:
    """Three calls of the agent per scripted session; one per model session (the tiny model calls no tool)."""
    solve = {"type": "scripted", "replies": [bash("echo start > log.txt"), bash("echo polar > answer.txt")]}
    solve["replies"].append({"content": "Done."})
    fail = {"type": "scripted", "replies": [bash("echo start > log.txt"), bash("echo nope > answer.txt")]}
    fail["replies"].append({"content": "Done."})
    base = {
        "instruction": "Write the word polar into answer.txt.",
        "harness": {"name": "agent", "config": {"max_turns": 4}},
        "runtime": {"prepare": [{"command": GIT_INIT}]},
        "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
    }
    # Short model replies: the tiny model's text is noise, and a CPU generates slowly.
    sampled = {**base, "harness": {"name": "agent", "config": {"max_turns": 4, "max_tokens": 8}}}
    return [
        {**sampled, "name": f"model-a-{tag}", "num_samples": PER_BATCH["model"] // 2},
        {**base, "name": f"solve-{tag}", "num_samples": PER_BATCH["solve"], "policies": [solve]},
        {**base, "name": f"fail-{tag}", "num_samples": PER_BATCH["fail"], "policies": [fail]},
        {**sampled, "name": f"model-b-{tag}", "num_samples": PER_BATCH["model"] // 2},
    ]


def expected_reward(task_name: str) -> float:
    return 1.0 if task_name.startswith("solve-") else 0.0  # the tiny model writes no file: the evaluator says 0


def flow_run_id(output: str) -> str:
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    assert found, output
    return found.group(1)


def ranked_first(session: str, urls: list[str]) -> str:
    fleet = FleetBackend([Member(u) for u in urls], connect=None)  # type: ignore[arg-type]  # ranking only
    return fleet.ranking(GenerateRequest((), session_id=session))[0].url


def peak(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = top = 0
    for _, step in events:
        level += step
        top = max(top, level)
    return top


def test_a_batch_over_two_worker_hosts_survives_an_inference_server_and_a_worker_host(cluster: Cluster):
    net, store = cluster.net, cluster.engine
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)
        print(f"cluster test: {name} at {phases[name]} s", file=sys.stderr, flush=True)

    names = {"a": tasks("a"), "b": tasks("b")}
    runs = {}
    for half in ("a", "b"):
        out = cluster.prefect(
            "deployment", "run", "polar-batch/batch", "--param", f"tasks={json.dumps(names[half])}",
            "--param", "dispatch=inline",
        )  # fmt: skip
        runs[half] = flow_run_id(out)  # each worker takes one flow run at a time (--limit 1): one half each

    def rows() -> list[tuple[Rollout, str]]:
        with Session(store) as db:
            found = db.execute(sa.select(Rollout, Task.name).join(Task, Rollout.task_id == Task.id)).all()
            return [(row, name) for row, name in found]

    def statuses() -> Counter:
        with store.connect() as conn:
            return Counter(conn.execute(sa.select(Rollout.status)).scalars())

    def captures_on(url: str) -> int:
        with store.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).where(Capture.server == url)).scalar_one()

    for half in ("a", "b"):
        wait_for(lambda h=half: cluster.flow_run_state(runs[h]) == "RUNNING", 120, f"half {half} to start")
    # Both halves run at once, one per worker host (each worker takes one flow run at a time).
    inf1, inf2 = cluster.inference["inf1"], cluster.inference["inf2"]
    wait_for(lambda: captures_on(inf1) >= 2, 240, "model calls on the first inference server")
    net.kill_host("inf1")
    phase("inference server killed")
    inference_killed_at = datetime.now().astimezone()

    wait_for(lambda: statuses()[RolloutStatus.COMPLETED] >= 20, 300, "a good part of the batch")
    killed = net.kill_host("w1")  # the worker, its flow process, its harnesses, its gateway replica
    assert killed
    host_killed_at = datetime.now().astimezone()
    phase("worker host killed")

    # The other host's half finishes; the dead host's flow run never will.
    wait_for(
        lambda: "COMPLETED" in {cluster.flow_run_state(runs["a"]), cluster.flow_run_state(runs["b"])},
        400,
        "the surviving host's half",
        every_s=2,
    )
    phase("surviving half done")
    stuck = [r for r, _ in rows() if not RolloutStatus(r.status).is_terminal]
    silent_s = (datetime.now().astimezone() - host_killed_at).total_seconds()
    time.sleep(max(0.0, STALE_AFTER_S + 1 - silent_s))
    out = cluster.prefect(
        "deployment", "run", "polar-retry-failed/retry-failed", "--param", "stale_after_s=3",
        "--param", "dispatch=inline", "--watch", "--watch-timeout", "300", host="w2", timeout_s=330,
    )  # fmt: skip
    assert "Completed" in out or "COMPLETED" in out, out
    elapsed = time.monotonic() - started
    phase("retry done")

    all_rows = rows()
    assert len(all_rows) == 2 * sum(PER_BATCH.values())
    interrupted = []
    for row, task_name in all_rows:
        results = row.stage_results or {}
        if (results.get("run") or {}).get("interrupted"):
            # Its harness died with the host mid-run: not launched again (it may have sampled), ended ERROR.
            assert row.status is RolloutStatus.ERROR and row.id in {r.id for r in stuck}, (row.id, row.status)
            interrupted.append(row.id)
            continue
        assert row.status is RolloutStatus.COMPLETED, (task_name, row.status, row.error)
        assert row.reward == expected_reward(task_name), (task_name, row.reward)
    assert len(interrupted) <= RUN_LIMIT  # at most the harnesses the killed host was running

    with Session(store) as db:
        captures = list(db.scalars(sa.select(Capture).order_by(Capture.rollout_id, Capture.seq)))
        by_rollout: dict[str, list[Capture]] = defaultdict(list)
        for capture in captures:
            by_rollout[capture.rollout_id].append(capture)
        ids = {c.id: c for c in captures}
        for rollout_id, chain in by_rollout.items():
            assert [c.seq for c in chain] == list(range(len(chain))), rollout_id  # none lost, none twice
            for capture in chain:
                assert capture.parent_id is None or ids[capture.parent_id].rollout_id == rollout_id
                if capture.status is CaptureStatus.OK:
                    assert len(full_prompt_ids(db, capture)) == capture.n_prompt  # the chain rebuilds the prompt
    task_of = {row.id: name for row, name in all_rows}
    model_calls = [c for c in captures if task_of[c.rollout_id].startswith("model") and c.status is CaptureStatus.OK]
    scripted_calls = [c for c in captures if not task_of[c.rollout_id].startswith("model")]
    assert all(c.server is None and c.scripted for c in scripted_calls)  # answered in the gateway, not sampled
    urls = [inf1, inf2]
    before = [c for c in model_calls if c.created_at < inference_killed_at]
    after = [c for c in model_calls if c.created_at > inference_killed_at + timedelta(seconds=1)]
    # Every gateway replica sends a session to the server it ranks first, until that server dies...
    assert before and all(c.server == ranked_first(c.rollout_id, urls) for c in before)
    # ...then the sessions that ranked it first move to the other one.
    assert after and all(c.server == inf2 for c in after)
    assert any(ranked_first(c.rollout_id, urls) == inf1 for c in after)

    # The calls of one session went through both gateway replicas (HAProxy's log: server, session key).
    replicas: dict[str, set[str]] = defaultdict(set)
    for line in cluster.lb_log.read_text().splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] == "POLAR" and parts[2].startswith("Bearer "):
            replicas[parts[2]].add(parts[1])
    assert any(len(servers) == 2 for servers in replicas.values()), dict(list(replicas.items())[:5])

    # The run limit held: at most RUN_LIMIT harnesses per host (intervals of the run stage as recorded in the rows).
    spans = []
    for row, _ in all_rows:
        timing = (row.stage_timings or {}).get("run") or {}
        if timing.get("started_at") and timing.get("finished_at"):
            spans.append((datetime.fromisoformat(timing["started_at"]), datetime.fromisoformat(timing["finished_at"])))
    run_peak = peak(spans)
    print(
        f"\ncluster: {len(all_rows)} rollouts in {elapsed:.0f} s; inference server killed after {len(before)} model "
        f"calls, {len(after)} after; worker host killed at {host_killed_at:%H:%M:%S} ({len(killed)} processes), "
        f"{len(stuck)} resumed by the retry flow, {len(interrupted)} interrupted mid-run; "
        f"peak harnesses running {run_peak} (limit {RUN_LIMIT} per host); "
        f"sessions over both replicas {sum(len(s) == 2 for s in replicas.values())}/{len(replicas)}; "
        f"phases {phases}"
    )
    assert run_peak <= 2 * RUN_LIMIT
