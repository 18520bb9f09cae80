"""Trainer-feed claim throughput: trajectories/s that concurrent claimers take (claim + ack), on Postgres and SQLite.

    .venv/bin/python benchmarks/bench_claims.py [--groups 400] [--samples 8] [--batch 4] [--claimers 1,2,4,8]
                                                 [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]

Each run fills a fresh store (a new Postgres schema, or a new SQLite file) with ``--groups`` complete groups of
``--samples`` trajectories (64 prompt + 256 response tokens each), then ``N`` threads claim ``--batch`` groups at a
time and ack them until nothing is left. It checks that every trajectory was received exactly once and prints
trajectories/s and claims/s, with the ratio against one claimer measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa

from db.engine import make_engine, make_session_factory
from db.enums import RolloutStatus, TaskStatus
from db.migrate import upgrade
from db.models import Rollout, Task, Trajectory
from polar.feed import ack, claim


def fill(factory, groups: int, samples: int) -> int:
    prompt, response = list(range(64)), list(range(256))
    with factory() as db, db.begin():
        for _ in range(groups):
            task_id = str(uuid.uuid4())
            db.add(
                Task(
                    id=task_id,
                    instruction="bench",
                    harness={},
                    runtime={},
                    evaluator={},
                    builder="prefix_merge",
                    num_samples=samples,
                    meta={},
                    status=TaskStatus.COMPLETED,
                )
            )
            rollouts = [str(uuid.uuid4()) for _ in range(samples)]
            db.flush()
            db.execute(
                sa.insert(Rollout),
                [
                    {
                        "id": r,
                        "task_id": task_id,
                        "sample_index": i,
                        "status": RolloutStatus.COMPLETED,
                        "stage_results": {},
                        "stage_timings": {},
                        "weight_version_min": "default",
                        "weight_version_max": "default",
                    }
                    for i, r in enumerate(rollouts)
                ],
            )
            db.execute(
                sa.insert(Trajectory),
                [
                    {
                        "rollout_id": r,
                        "builder": "prefix_merge",
                        "chain_index": 0,
                        "capture_ids": [1],
                        "prompt_ids": prompt,
                        "response_ids": response,
                        "loss_mask": [1] * 256,
                        "response_logprobs": [-0.5] * 256,
                        "reward": 1.0,
                        "weight_version_min": "default",
                        "weight_version_max": "default",
                        "version_spans": [],
                        "turn_count": 1,
                        "n_prompt": 64,
                        "n_response": 256,
                        "n_loss_tokens": 256,
                        "status": "COMPLETED",
                    }
                    for r in rollouts
                ],
            )
    return groups * samples


def drain(factory, claimers: int, batch: int) -> tuple[float, int, list[int]]:
    received: list[list[int]] = [[] for _ in range(claimers)]
    claims = [0] * claimers
    barrier = threading.Barrier(claimers + 1)

    def work(index: int) -> None:
        barrier.wait()
        while True:
            got = claim(factory, f"trainer-{index}", max_groups=batch)
            if not got.groups:
                return
            received[index] += [t.id for g in got.groups for t in g.trajectories]
            ack(factory, got.claim_id, f"trainer-{index}")
            claims[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started, sum(claims), [i for r in received for i in r]


def run(url_for, label: str, args) -> None:
    print(f"\n{label}: {args.groups} groups x {args.samples} trajectories, {args.batch} groups per claim")
    print(f"{'claimers':>9} {'traj/s':>9} {'claims/s':>9} {'vs 1':>6}  exactly once")
    base = None
    for n in args.claimers:
        url, cleanup = url_for()
        try:
            upgrade(url)
            engine = make_engine(url, pool_size=max(5, n + 2)) if url.startswith("postgresql") else make_engine(url)
            factory = make_session_factory(engine)
            total = fill(factory, args.groups, args.samples)
            seconds, claims, ids = drain(factory, n, args.batch)
            once = len(ids) == len(set(ids)) == total
            rate = total / seconds
            base = base or rate
            print(f"{n:>9} {rate:>9.0f} {claims / seconds:>9.1f} {rate / base:>5.2f}x  {'yes' if once else 'NO'}")
            engine.dispose()
        finally:
            cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--claimers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()

    if args.postgres:
        from sqlalchemy import make_url, text

        def postgres_url():
            schema = f"polar_bench_{uuid.uuid4().hex[:10]}"
            admin = make_engine(args.postgres)
            with admin.begin() as c:
                c.execute(text(f'CREATE SCHEMA "{schema}"'))

            def drop() -> None:
                with admin.begin() as c:
                    c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
                admin.dispose()

            url = make_url(args.postgres).update_query_dict({"options": f"-csearch_path={schema}"})
            return url.render_as_string(hide_password=False), drop

        run(postgres_url, "Postgres (FOR UPDATE SKIP LOCKED)", args)

    import tempfile

    def sqlite_url():
        folder = tempfile.TemporaryDirectory()
        return f"sqlite:///{folder.name}/bench.db", folder.cleanup

    run(sqlite_url, "SQLite (conditional update, one writer at a time)", args)


if __name__ == "__main__":
    main()
