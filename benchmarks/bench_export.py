"""Export memory: peak RSS of streamed RL exports (JSONL and parquet) of 10k and 100k synthetic trajectories, next
to loading the same rows all at once (the naive baseline), each in a fresh process.

    .venv/bin/python benchmarks/bench_export.py [--sizes 10000,100000] [--postgres URL]

A trajectory has 64 prompt and 256 response tokens (ids, mask, logprobs), so 100k of them are about 32M tokens.
Streaming keeps one batch (1,000 rows) in memory: its peak should not grow with the store, while the baseline's does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from db.engine import make_engine, make_session_factory  # noqa: E402
from db.enums import RolloutStatus, TaskStatus  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.models import Rollout, Task, Trajectory  # noqa: E402

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from db.engine import make_engine, make_session_factory
from polar.settings import Settings
from polar.export import export
import sqlalchemy as sa
from db.models import Trajectory
mode, url, out = sys.argv[1], sys.argv[2], sys.argv[3]
factory = make_session_factory(make_engine(url))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
if mode == "naive":
    with factory() as db:
        rows = [dict(prompt_ids=list(t.prompt_ids), response_ids=list(t.response_ids), loss_mask=list(t.loss_mask),
                     response_logprobs=list(t.response_logprobs)) for t in db.scalars(sa.select(Trajectory))]
    count = len(rows)
else:
    count = export(factory, Settings(database_url=url), Path(out), kind="rl", fmt=mode).rows
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seconds = time.perf_counter() - started
print(json.dumps({{"rows": count, "peak_mb": peak / 1024, "baseline_mb": base / 1024, "seconds": seconds}}))
"""


def fill(url: str, n: int, batch: int = 5000) -> None:
    engine = make_engine(url)
    factory = make_session_factory(engine)
    import random

    rng = random.Random(0)  # 97 distinct token rows, cycled: realistic entropy for the writers, a cheap fill
    variants = [
        (
            [rng.randrange(150_000) for _ in range(64)],
            [rng.randrange(150_000) for _ in range(256)],
            [round(-rng.random() * 5, 4) for _ in range(256)],
        )
        for _ in range(97)
    ]
    with factory() as db, db.begin():
        task_id = str(uuid.uuid4())
        db.add(
            Task(
                id=task_id,
                instruction="bench",
                harness={"name": "agent"},
                runtime={},
                evaluator={},
                builder="prefix_merge",
                num_samples=n,
                meta={},
                status=TaskStatus.COMPLETED,
            )
        )
        db.flush()
        for start in range(0, n, batch):
            ids = [str(uuid.uuid4()) for _ in range(min(batch, n - start))]
            db.execute(
                sa.insert(Rollout),
                [
                    {
                        "id": r,
                        "task_id": task_id,
                        "sample_index": start + i,
                        "status": RolloutStatus.COMPLETED,
                        "stage_results": {},
                        "stage_timings": {},
                    }
                    for i, r in enumerate(ids)
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
                        "prompt_ids": variants[i % 97][0],
                        "response_ids": variants[i % 97][1],
                        "loss_mask": [1] * 256,
                        "response_logprobs": variants[i % 97][2],
                        "reward": 1.0,
                        "version_spans": [],
                        "turn_count": 1,
                        "n_prompt": 64,
                        "n_response": 256,
                        "n_loss_tokens": 256,
                        "status": "COMPLETED",
                    }
                    for i, r in enumerate(ids)
                ],
            )
    engine.dispose()


def measure(mode: str, url: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT)), mode, url, str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000])
    args = parser.parse_args()
    print(f"{'trajectories':>12} {'mode':>8} {'peak RSS':>10} {'export':>8} {'seconds':>8} {'rows/s':>8} {'file':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for n in args.sizes:
            url = f"sqlite:///{folder}/bench-{n}.db"
            upgrade(url)
            started = time.perf_counter()
            fill(url, n)
            print(f"{'':>12} filled {n} trajectories in {time.perf_counter() - started:.1f} s")
            for mode in ("jsonl", "parquet", "naive"):
                out = Path(folder) / f"export-{n}.{mode}"
                result = measure(mode, url, out)
                size = f"{out.stat().st_size / 2**20:7.0f}MB" if out.exists() else "-"
                grown = result["peak_mb"] - result["baseline_mb"]
                print(
                    f"{n:>12} {mode:>8} {result['peak_mb']:>8.0f}MB {grown:>6.0f}MB {result['seconds']:>8.1f} "
                    f"{result['rows'] / result['seconds']:>8.0f} {size:>9}"
                )
                if out.exists():
                    out.unlink()


if __name__ == "__main__":
    main()
