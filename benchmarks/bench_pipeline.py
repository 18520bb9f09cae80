"""Rollout pipeline throughput with simulated stage durations: measured vs the ideal bound for the stage
limits, vs running each rollout's stages back-to-back, and Prefect's overhead per rollout.

    .venv/bin/python benchmarks/bench_pipeline.py [--rollouts 24] [--durations 0.2,1.0,0.2,0.1]
        [--limits 2,4,2] [--ready 4] [--no-prefect]

Each simulated stage sleeps its duration inside the real stage bookkeeping (``run_stage``: the rollout row is
claimed, each stage begins and finishes in the store), so the three measurements differ only in orchestration:

- pipeline: ``drive_rollout`` with the stage limits (init/run/postrun) and the READY buffer, no Prefect;
- back-to-back: each rollout runs its four stages in a row while holding one of ``run`` slots (no stage
  limits, no pipelining: what a pool of workers that each run whole rollouts does);
- Prefect: the same pipeline as the rollout flow (one flow run and four task runs per rollout), subflows of a
  batch flow, on Prefect's ephemeral server (a temporary SQLite-backed server) unless PREFECT_API_URL names one.

Ideal bound: a rollout needs one slot of each limited stage for that stage's duration, so throughput is at most
min(limit / duration) over init, run and postrun (and ready_buffer / init duration). Back-to-back bound:
run_limit / (sum of the four durations). Prefect's overhead per rollout is reported two ways: the extra wall
time of the whole batch divided by the rollouts, and the extra latency of one rollout run alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGE_NAMES = ("init", "run", "postrun", "evaluate")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=24)
    parser.add_argument("--durations", default="0.2,1.0,0.2,0.1", help="seconds of init,run,postrun,evaluate")
    parser.add_argument("--limits", default="2,4,2", help="concurrency of init,run,postrun")
    parser.add_argument("--ready", type=int, default=4, help="READY buffer")
    parser.add_argument(
        "--alone", type=int, default=4, help="rollouts run one at a time for the latency overhead (>= 1)"
    )
    parser.add_argument("--no-prefect", action="store_true")
    return parser.parse_args()


def configure(args: argparse.Namespace, home: Path) -> None:
    """Settings for this process (the flows read them from the environment) and Prefect's home."""
    init, run, postrun = (int(x) for x in args.limits.split(","))
    os.environ.update(
        POLAR_HOME=str(home),
        POLAR_DATABASE_URL=f"sqlite:///{home / 'bench.db'}",
        POLAR_GATEWAY_URL="http://127.0.0.1:9",  # simulated stages never call the gateway
        POLAR_INIT_CONCURRENCY=str(init),
        POLAR_RUN_CONCURRENCY=str(run),
        POLAR_POSTRUN_CONCURRENCY=str(postrun),
        POLAR_READY_BUFFER=str(args.ready),
        POLAR_BATCH_MAX_ACTIVE=str(max(args.rollouts, 1)),
    )
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")


def simulated_stages(durations: dict[str, float]):
    """Stage functions that do the real bookkeeping around a sleep of the stage's duration."""
    from db.enums import RolloutStatus
    from db.stage_results import EvaluateResult, InitResult, PostrunResult, RunResult
    from polar.rollout.stages.common import run_stage
    from polar.rollout.state import Stage, StageOutput

    results = {
        Stage.INIT: InitResult(),
        Stage.RUN: RunResult(outcome=RolloutStatus.COMPLETED),
        Stage.POSTRUN: PostrunResult(),
    }

    def make(stage: Stage):
        async def body(ctx, view, owner):
            await asyncio.sleep(durations[stage.value])
            if stage is Stage.EVALUATE:
                return StageOutput(EvaluateResult(reward=1.0), status=RolloutStatus.COMPLETED, reward=1.0)
            return StageOutput(results[stage])

        async def function(ctx, rollout_id, *, owner):
            return await run_stage(ctx, rollout_id, stage, owner, body)

        return function

    return {stage: make(stage) for stage in Stage}


def submit(ctx, n: int) -> list[str]:
    from polar.rollout import submit_tasks

    task = {
        "name": "bench",
        "instruction": "simulated",
        "harness": {"name": "command", "config": {"command": "true"}},
        "evaluator": {"type": "command", "config": {"command": "true"}},
        "num_samples": n,
    }
    return list(submit_tasks(ctx.factory, [task])[0].rollout_ids)


async def plain_pipeline(ctx, stages, ids: list[str]) -> float:
    from polar.rollout import drive_rollout, process_limiter

    limiter = process_limiter(ctx.settings)

    async def one(rollout_id: str) -> None:
        async def call(stage, view):
            return await stages[stage](ctx, rollout_id, owner=f"plain-{rollout_id}")

        await drive_rollout(ctx, rollout_id, f"plain-{rollout_id}", limiter=limiter, call=call)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in ids))
    return time.perf_counter() - started


async def plain_alone(ctx, stages, ids: list[str]) -> float:
    """The rollouts one at a time, without Prefect (the latency baseline)."""
    started = time.perf_counter()
    for rollout_id in ids:
        await plain_pipeline(ctx, stages, [rollout_id])
    return time.perf_counter() - started


async def back_to_back(ctx, stages, ids: list[str], slots: int) -> float:
    from polar.rollout import NoLimits, drive_rollout

    gate = asyncio.Semaphore(slots)

    async def one(rollout_id: str) -> None:
        async def call(stage, view):
            return await stages[stage](ctx, rollout_id, owner=f"b2b-{rollout_id}")

        async with gate:
            await drive_rollout(ctx, rollout_id, f"b2b-{rollout_id}", limiter=NoLimits(), call=call)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in ids))
    return time.perf_counter() - started


def prefect_runs(ctx, stages, batch_ids: list[str], alone_ids: list[str]) -> tuple[float, float]:
    from prefect import flow

    from flows.rollout import build_rollout_flow

    rollout = build_rollout_flow(stages, name="bench-rollout")

    @flow(name="bench-batch", persist_result=False)
    async def batch(ids: list[str]) -> float:
        started = time.perf_counter()
        await asyncio.gather(*(rollout(i) for i in ids))
        return time.perf_counter() - started

    @flow(name="bench-alone", persist_result=False)
    async def alone(ids: list[str]) -> float:
        started = time.perf_counter()
        for i in ids:
            await rollout(i)
        return time.perf_counter() - started

    asyncio.run(alone(alone_ids[:1]))  # starts the server, warms the client
    return asyncio.run(batch(batch_ids)), asyncio.run(alone(alone_ids[1:]))


def main() -> None:
    args = parse_args()
    durations = dict(zip(STAGE_NAMES, (float(x) for x in args.durations.split(",")), strict=True))
    home = Path(tempfile.mkdtemp(prefix="polar-bench-pipeline-"))
    configure(args, home)

    from polar.proxy.embedded import start_embedded
    from polar.rollout.context import close_contexts, rollout_context

    ctx = rollout_context(start_gateway=start_embedded)
    limits = {
        "init": ctx.settings.init_concurrency,
        "run": ctx.settings.run_concurrency,
        "postrun": ctx.settings.postrun_concurrency,
    }
    stages = simulated_stages(durations)
    n = args.rollouts

    per_stage = {name: limits[name] / durations[name] for name in limits}
    per_stage["ready"] = args.ready / durations["init"]
    bottleneck = min(per_stage, key=per_stage.get)
    ideal = 60 * per_stage[bottleneck]
    sequential = 60 * limits["run"] / sum(durations.values())

    print(
        "simulated stages: "
        + ", ".join(f"{name} {durations[name]:.2f} s" for name in STAGE_NAMES)
        + f"; limits init {limits['init']}, run {limits['run']}, postrun {limits['postrun']}, ready {args.ready}; "
        f"{n} rollouts"
    )
    print(f"{'ideal bound for the stage limits':<44} {ideal:7.1f} rollouts/min  (bottleneck: {bottleneck})")
    print(f"{'bound, stages back-to-back in run slots':<44} {sequential:7.1f} rollouts/min")

    wall = asyncio.run(plain_pipeline(ctx, stages, submit(ctx, n)))
    plain_rate = 60 * n / wall
    print(
        f"{'measured: pipeline, no Prefect':<44} {plain_rate:7.1f} rollouts/min  ({plain_rate / ideal:.0%} of the "
        f"bound, {wall:.1f} s)"
    )
    wall_b2b = asyncio.run(back_to_back(ctx, stages, submit(ctx, n), limits["run"]))
    b2b_rate = 60 * n / wall_b2b
    print(
        f"{'measured: back-to-back, no Prefect':<44} {b2b_rate:7.1f} rollouts/min  (pipeline is "
        f"{plain_rate / b2b_rate:.2f}x)"
    )

    if not args.no_prefect:
        api = os.environ.get("PREFECT_API_URL") or "Prefect ephemeral server (SQLite)"
        alone_ids = submit(ctx, args.alone + 1)
        started = time.perf_counter()
        prefect_wall, alone_wall = prefect_runs(ctx, stages, submit(ctx, n), alone_ids)
        prefect_rate = 60 * n / prefect_wall
        print(
            f"{'measured: pipeline as Prefect flows':<44} {prefect_rate:7.1f} rollouts/min  "
            f"({prefect_rate / ideal:.0%} of the bound, {prefect_wall:.1f} s; {api})"
        )
        baseline = asyncio.run(plain_alone(ctx, stages, submit(ctx, args.alone))) / args.alone
        latency = alone_wall / args.alone - baseline
        print(
            f"Prefect overhead per rollout: {(prefect_wall - wall) / n:+.2f} s of batch wall time; "
            f"{latency:+.2f} s of latency for a rollout run alone ({baseline:.2f} s without Prefect; a flow run + "
            "4 task runs)"
        )
        print(f"(Prefect runs including server start took {time.perf_counter() - started:.1f} s)")
    close_contexts()


if __name__ == "__main__":
    main()
