"""The docker runtime on a real engine: container start, exec round trip and teardown times, and the overlap the
READY buffer buys when real containers are initialised while other rollouts run.

    .venv/bin/python benchmarks/bench_docker.py [--containers 10] [--execs 50] [--rollouts 8] \
        [--prepare 1.0] [--run 2.0]

Needs a Docker engine and the base image (``scripts/docker_env.sh start``).

- start: ``DockerRuntime.start(fresh=True)`` (folder tree, container create + start, init process);
  exec: ``exec("true")`` on a running container (exec create + attach + wait, output files read back);
  teardown: ``stop(remove=True)`` (forced removal, folder deleted).
- READY buffer: ``--rollouts`` rollouts of a command harness in docker runtimes (prepare ``sleep PREPARE``,
  harness ``sleep RUN``) through the real stages (``drive_rollout``: store, gateway session, artifacts, file
  evaluator), with 2 run slots and 2 init slots, once with a READY buffer of 1 (at most one runtime prepared
  ahead) and once with 4. The gain is the init time hidden behind running harnesses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IMAGE = os.environ.get("POLAR_DOCKER_IMAGE", "polar/base:bookworm")
# The gateway relay runs on the tools folder's Node (make tools, or polar harness install node).
TOOLS = Path(os.environ.get("POLAR_TOOLS") or Path(__file__).resolve().parents[1] / ".polar-tools")


def stats(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"median {statistics.median(ms):7.1f} ms   p90 {ms[int(0.9 * (len(ms) - 1))]:7.1f} ms   (n={len(ms)})"


async def lifecycle(root: Path, containers: int, execs: int) -> None:
    from polar.runtime.docker import DockerRuntime

    starts, stops, rounds = [], [], []
    for i in range(containers):
        rt = DockerRuntime(f"bench-{i}", root, image=IMAGE, tools_dir=root / "no-tools")
        t = time.perf_counter()
        await rt.start(fresh=True)
        starts.append(time.perf_counter() - t)
        if i == 0:
            for _ in range(execs):
                t = time.perf_counter()
                result = await rt.exec("true")
                rounds.append(time.perf_counter() - t)
                assert result.ok, result
        t = time.perf_counter()
        await rt.stop(remove=True)
        stops.append(time.perf_counter() - t)
    print(f"container start   {stats(starts)}")
    print(f"exec round trip   {stats(rounds)}")
    print(f"teardown          {stats(stops)}")


async def ready_overlap(home: Path, rollouts: int, prepare_s: float, run_s: float, ready: int) -> float:
    from polar.proxy.embedded import start_embedded
    from polar.rollout import RolloutContext, drive_rollouts, process_limiter, submit_tasks
    from polar.settings import Settings

    settings = Settings(
        home=home,
        database_url=f"sqlite:///{home / 'bench.db'}",
        runtime_root=home / "runtimes",
        runtime="docker",
        docker_image=IMAGE,
        tools=TOOLS,
        init_concurrency=2,
        run_concurrency=2,
        postrun_concurrency=2,
        ready_buffer=ready,
        init_retries=0,
        run_retries=0,
    )
    ctx = RolloutContext.create(settings, start_gateway=start_embedded)
    try:
        task = {
            "name": f"ready-{ready}",
            "instruction": "Write polar into answer.txt.",
            "harness": {"name": "command", "config": {"command": f"sleep {run_s} && echo polar > answer.txt"}},
            "runtime": {"type": "docker", "prepare": [{"command": f"sleep {prepare_s}"}]},
            "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
            "num_samples": rollouts,
        }
        (submitted,) = submit_tasks(ctx.factory, [task])
        started = time.perf_counter()
        results = await drive_rollouts(ctx, list(submitted.rollout_ids), "bench", limiter=process_limiter(settings))
        wall = time.perf_counter() - started
        bad = [r for r in results if isinstance(r, BaseException) or r.reward != 1.0]
        assert not bad, bad
        return wall
    finally:
        ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=10)
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--prepare", type=float, default=1.0, help="seconds of the prepare command")
    parser.add_argument("--run", type=float, default=2.0, help="seconds the harness runs")
    args = parser.parse_args()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    from polar.runtime.docker_engine import docker_available

    reason = docker_available()
    if reason:
        sys.exit(f"{reason} (scripts/docker_env.sh start)")
    with tempfile.TemporaryDirectory(prefix="polar-bench-docker-") as tmp:
        asyncio.run(lifecycle(Path(tmp) / "lifecycle", args.containers, args.execs))
        print(
            f"\nREADY buffer: {args.rollouts} rollouts, init = container + prepare {args.prepare:g} s, run "
            f"{args.run:g} s, 2 run slots"
        )
        walls = {}
        for ready in (1, 4):
            walls[ready] = asyncio.run(
                ready_overlap(Path(tmp) / f"ready{ready}", args.rollouts, args.prepare, args.run, ready)
            )
            print(
                f"  ready buffer {ready}: wall {walls[ready]:6.2f} s   {args.rollouts / walls[ready] * 60:5.1f} "
                "rollouts/min"
            )
        bound = args.rollouts / 2 * args.run
        print(
            f"  run-bound ideal (runs back to back in 2 slots): {bound:.2f} s; buffer 4 saves "
            f"{walls[1] - walls[4]:.2f} s"
        )


if __name__ == "__main__":
    main()
