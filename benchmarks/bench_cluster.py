"""Scale-out with simulated stage times: rollouts/min of one worker host vs two, each against its stage-limit bound.

    .venv/bin/python benchmarks/bench_cluster.py [--rollouts 96] [--durations 0.2,1.0,0.2,0.1]
        [--limits 2,4,2] [--ready 4] [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

A worker host is a separate process with its own event loop and its own stage limits (init/run/postrun and the
READY buffer: what one machine can hold). Every host works through the same list of rollouts in one shared
store (a fresh Postgres database, migrated here, dropped at the end): it claims each rollout in its row
(``drive_rollout``: claim, then each stage begins and finishes in the store) and skips the ones another host
holds, so the hosts share the batch the way two workers share a deployment-dispatched one, and no rollout runs
twice. Each simulated stage sleeps its duration inside the real stage bookkeeping. Host processes start, import
and connect first; the clock starts when all are ready.

Bound for ``n`` hosts: ``n * min(limit / duration)`` over init, run, postrun (and ready / init duration), in
rollouts per minute. The goal: two hosts give at least 1.8x the rollouts/min of one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAGE_NAMES = ("init", "run", "postrun", "evaluate")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=96)
    parser.add_argument("--durations", default="0.2,1.0,0.2,0.1", help="seconds of init,run,postrun,evaluate")
    parser.add_argument("--limits", default="2,4,2", help="per-host concurrency of init,run,postrun")
    parser.add_argument("--ready", type=int, default=4, help="per-host READY buffer")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("POLAR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="a Postgres server to make the throw-away store on",
    )
    parser.add_argument("--host", help=argparse.SUPPRESS)  # internal: run as one worker host
    return parser.parse_args()


# ---- one worker host (a subprocess) ------------------------------------------------------------------------


async def host_main(spec: dict) -> dict:
    from bench_pipeline import simulated_stages

    from polar.errors import RolloutClaimed
    from polar.proxy.embedded import start_embedded
    from polar.rollout import drive_rollout, process_limiter
    from polar.rollout.context import close_contexts, rollout_context

    ctx = rollout_context(start_gateway=start_embedded)
    stages = simulated_stages(spec["durations"])
    limiter = process_limiter(ctx.settings)
    gate = asyncio.Semaphore(spec["active"])
    name = spec["name"]
    ran: list[str] = []

    async def one(rollout_id: str) -> None:
        owner = f"{name}-{rollout_id}"

        async def call(stage, view):
            return await stages[stage](ctx, rollout_id, owner=owner)

        async with gate:
            try:
                summary = await drive_rollout(ctx, rollout_id, owner, limiter=limiter, call=call)
            except RolloutClaimed:
                return  # another host holds it
            if len(summary.skipped) < len(STAGE_NAMES):  # not one another host had already finished
                ran.append(rollout_id)

    Path(spec["ready_file"]).touch()
    while not Path(spec["go_file"]).exists():
        await asyncio.sleep(0.005)
    started = time.time()
    # Every host walks the same list; a host only runs the rollouts it claims first.
    await asyncio.gather(*(one(i) for i in spec["ids"]))
    finished = time.time()
    close_contexts()
    return {"name": name, "started": started, "finished": finished, "ran": ran}


# ---- the driver ------------------------------------------------------------------------------------------


def make_database(base_url: str) -> tuple[str, str]:
    import psycopg
    from sqlalchemy import make_url

    base = make_url(base_url)
    name = f"polar_bench_cluster_{uuid.uuid4().hex[:8]}"
    admin = base.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.set(database=name).render_as_string(hide_password=False), admin


def drop_database(url: str, admin: str) -> None:
    import psycopg
    from sqlalchemy import make_url

    name = make_url(url).database
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def host_env(args: argparse.Namespace, home: Path, url: str) -> dict[str, str]:
    init, run, postrun = (int(x) for x in args.limits.split(","))
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'benchmarks'}",
        POLAR_HOME=str(home),
        POLAR_DATABASE_URL=url,
        POLAR_GATEWAY_URL="http://127.0.0.1:9",  # simulated stages never call the gateway
        POLAR_INIT_CONCURRENCY=str(init),
        POLAR_RUN_CONCURRENCY=str(run),
        POLAR_POSTRUN_CONCURRENCY=str(postrun),
        POLAR_READY_BUFFER=str(args.ready),
        POLAR_STAGE_LIMITS="process",  # one host's limits are its own machine's
        POLAR_HEARTBEAT_S="1",
        POLAR_CONTROL_TOKEN="bench-cluster",  # never used: no control API here
    )
    return env


def submit(url: str, home: Path, n: int) -> list[str]:
    os.environ.update(
        POLAR_DATABASE_URL=url,
        POLAR_HOME=str(home),
        POLAR_GATEWAY_URL="http://127.0.0.1:9",
        POLAR_CONTROL_TOKEN="bench",
    )
    from polar.proxy.embedded import start_embedded
    from polar.rollout import submit_tasks
    from polar.rollout.context import close_contexts, rollout_context
    from polar.settings import get_settings

    get_settings.cache_clear()
    ctx = rollout_context(start_gateway=start_embedded)
    task = {
        "name": f"bench-cluster-{uuid.uuid4().hex[:6]}",
        "instruction": "simulated",
        "harness": {"name": "command", "config": {"command": "true"}},
        "evaluator": {"type": "command", "config": {"command": "true"}},
        "num_samples": n,
    }
    ids = list(submit_tasks(ctx.factory, [task])[0].rollout_ids)
    close_contexts()
    return ids


def run_hosts(args: argparse.Namespace, url: str, hosts: int, durations: dict[str, float]) -> dict:
    home = Path(tempfile.mkdtemp(prefix="polar-bench-cluster-"))
    ids = submit(url, home, args.rollouts)
    go = home / "go"
    init, run, _ = (int(x) for x in args.limits.split(","))
    processes, specs = [], []
    for index in range(hosts):
        spec = {
            "name": f"host{index + 1}",
            "ids": ids,
            "durations": durations,
            "active": args.ready + run + 2 * init,  # enough rollouts in flight to keep every stage busy
            "ready_file": str(home / f"ready-{index}"),
            "go_file": str(go),
            "out": str(home / f"out-{index}.json"),
        }
        specs.append(spec)
        (home / f"spec-{index}.json").write_text(json.dumps(spec))
        processes.append(
            subprocess.Popen(
                [sys.executable, __file__, "--host", str(home / f"spec-{index}.json")],
                env=host_env(args, home / f"h{index}", url),
                stdin=subprocess.DEVNULL,
            )
        )
    try:
        deadline = time.monotonic() + 180
        while not all(Path(s["ready_file"]).exists() for s in specs):
            if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
                raise RuntimeError("a host process did not get ready")
            time.sleep(0.05)
        go.touch()
        for process in processes:
            if process.wait(timeout=600) != 0:
                raise RuntimeError(f"a host process failed with code {process.returncode}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    outs = [json.loads(Path(s["out"]).read_text()) for s in specs]
    wall = max(o["finished"] for o in outs) - min(o["started"] for o in outs)
    ran = [rid for o in outs for rid in o["ran"]]
    return {"wall": wall, "per_host": {o["name"]: len(o["ran"]) for o in outs}, "ran": ran, "ids": ids}


def main() -> None:
    args = parse_args()
    if args.host:
        spec = json.loads(Path(args.host).read_text())
        Path(spec["out"]).write_text(json.dumps(asyncio.run(host_main(spec))))
        return
    durations = dict(zip(STAGE_NAMES, (float(x) for x in args.durations.split(",")), strict=True))
    init, run, postrun = (int(x) for x in args.limits.split(","))
    per_stage = {
        "init": init / durations["init"],
        "run": run / durations["run"],
        "postrun": postrun / durations["postrun"],
    }
    per_stage["ready"] = args.ready / durations["init"]
    bottleneck = min(per_stage, key=lambda k: per_stage[k])
    per_host_bound = 60 * per_stage[bottleneck]
    print(
        "simulated stages: "
        + ", ".join(f"{name} {durations[name]:.2f} s" for name in STAGE_NAMES)
        + f"; per host: limits init {init}, run {run}, postrun {postrun}, ready {args.ready}; {args.rollouts} rollouts"
    )
    url, admin = make_database(args.database_url)
    try:
        from db.migrate import upgrade

        upgrade(url)
        rates = {}
        for hosts in (1, 2):
            result = run_hosts(args, url, hosts, durations)
            assert sorted(result["ran"]) == sorted(result["ids"]), "a rollout ran twice or not at all"
            rate = 60 * args.rollouts / result["wall"]
            bound = hosts * per_host_bound
            rates[hosts] = rate
            print(
                f"{hosts} worker host{'s' if hosts > 1 else ' '}: {rate:7.1f} rollouts/min  (bound {bound:.1f}, "
                f"{rate / bound:.0%} of it; {result['wall']:.1f} s; rollouts per host {result['per_host']}; "
                f"bottleneck {bottleneck})"
            )
        ratio = rates[2] / rates[1]
        print(f"two hosts vs one: {ratio:.2f}x (goal >= 1.8x)")
    finally:
        drop_database(url, admin)


if __name__ == "__main__":
    main()
