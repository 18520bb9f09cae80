"""The cluster of tests/cluster/test_cluster.py: the hosts (network namespaces), the processes each runs, and the
settings they share, as a module-scoped fixture. Everything is started by PID and stopped by PID; the namespaces
are deleted at the end, even on failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from db.engine import make_engine
from polar.errors import StoreError
from tests.cluster.hosts import SUBNET, Network, in_namespace, postgres_bin, wait_for

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTS = ["db", "inf1", "inf2", "w1", "w2", "lb"]
POOL = "polar-process"
STALE_AFTER_S = 15
LIMITS = {"init": 12, "run": 12, "postrun": 12}  # fleet-wide (Prefect global concurrency limits)
READY = 12


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
    and logging each request's server, status and session key, which is how the test sees which replica served a
    call."""
    text = (REPO / "deploy" / "haproxy.cfg").read_text()
    assert "balance hash var(txn.session_key)" in text
    text = text.replace("balance hash var(txn.session_key)", "balance roundrobin")
    text = text.replace(
        "frontend polar_gateway\n",
        "frontend polar_gateway\n    http-request capture req.hdr(authorization) len 120\n"
        '    log-format "POLAR %s %ST %[capture.req.hdr(0)]"\n',
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
                # Expired leases (the stage slots of a killed host) are freed within a second of expiring.
                PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS="1",
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
                # The default: fleet-wide limits (PREFECT_API_URL is set), each slot a lease of POLAR_LIMIT_LEASE_S.
                POLAR_STAGE_LIMITS="auto",
                POLAR_RUN_CONCURRENCY=str(LIMITS["run"]),
                POLAR_INIT_CONCURRENCY=str(LIMITS["init"]),
                POLAR_POSTRUN_CONCURRENCY=str(LIMITS["postrun"]),
                POLAR_READY_BUFFER=str(READY),
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
