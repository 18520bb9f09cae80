"""Trajectory builder throughput on a long agent session, and merge statistics per harness.

Throughput: one synthetic append-mode session (default 200 turns: every reply calls a tool, every result is ~400
characters; real prompts from the PromptBuilder and tokenizer). It times ``per_request`` and ``prefix_merge``
in memory (records -> traces), and through the store (``build_and_store`` on a SQLite file: load the captures,
build, replace the rows, write the merge stats, commit), and prints turns/s. Then it prints the per-harness
table for that session.

Per-harness table for recorded sessions (e.g. real CLIs through the gateway): pass their rollout ids and the
store's URL; nothing is written.

    .venv/bin/python benchmarks/bench_trajectories.py [--turns 200] [--tokenizer small|qwen] [--repeat 5]
    .venv/bin/python benchmarks/bench_trajectories.py --database-url URL --rollouts ID [ID ...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

from db import migrate
from db.engine import make_engine, make_session_factory, session_scope
from db.enums import RolloutStatus
from db.models import Rollout, Task
from polar.report.merges import format_summary, summarize_by_harness
from polar.settings import get_settings
from polar.tokens.tokenizer import load_tokenizer
from polar.trajectory.registry import BUILDERS, get_builder
from polar.trajectory.store import build_and_store
from tests.trajectory.synthetic import LINEAR_TOOL_SESSION, RandomChooser, SessionSimulator, write_session


def print_harness_table(database_url: str, rollout_ids: Sequence[str], *, builder: str = "prefix_merge") -> None:
    """Captures, merged traces, merge ratio and conditioning-exact rate per harness, for ``rollout_ids``."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            rows = summarize_by_harness(session, rollout_ids, builder=builder)
    finally:
        engine.dispose()
    print(f"builder={builder}  rollouts={len(rollout_ids)}  (ratio = successful captures per trace)")
    print(format_summary(rows))


def timed(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tokenizer", default="small", choices=["small", "qwen"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", help="a store holding recorded sessions (with --rollouts)")
    parser.add_argument("--rollouts", nargs="*", default=[], help="rollout ids to tabulate per harness")
    args = parser.parse_args()
    if args.rollouts:
        if not args.database_url:
            parser.error("--rollouts needs --database-url")
        print_harness_table(args.database_url, args.rollouts)
        return
    throughput(args.turns, args.tokenizer, args.repeat)


def throughput(n_turns: int = 200, tokenizer_name: str = "small", repeat: int = 5) -> None:
    """Builder throughput on one synthetic append-mode session of ``n_turns`` tool turns."""
    tokenizer = load_tokenizer(tokenizer_name, get_settings().cache_dir)
    started = time.perf_counter()
    session = SessionSimulator(tokenizer, RandomChooser(0), shape=LINEAR_TOOL_SESSION).run(n_turns)
    setup_s = time.perf_counter() - started
    turns = len(session.captures)
    last = session.captures[-1]
    context = len(session.full_prompts[last.id]) + len(last.output_ids)
    stored = sum(len(c.prompt_delta_ids) + len(c.output_ids) for c in session.captures)
    print(
        f"session: {turns} turns, tokenizer={tokenizer_name}, final context {context} tokens, {stored} tokens stored "
        f"as capture deltas (generated in {setup_s:.1f} s)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        migrate.upgrade(url)
        engine = make_engine(url)
        factory = make_session_factory(engine)
        with session_scope(factory) as db:
            task = Task(instruction="bench", harness={"name": "synthetic"}, runtime={}, evaluator={}, num_samples=1)
            db.add(task)
            db.flush()
            rollout = Rollout(task_id=task.id, status=RolloutStatus.COMPLETED, reward=1.0)
            db.add(rollout)
            db.flush()
            write_session(db, rollout.id, session)
            rollout_id = rollout.id

        def store(name: str) -> None:
            with session_scope(factory) as db:
                build_and_store(db, rollout_id, builder=name)

        print(f"median of {repeat}; store = load captures + build + replace rows + stats + commit (SQLite file)")
        header = f"{'traces':>6} {'trace tokens':>13} {'memory ms':>10} {'turns/s':>9} {'store ms':>9} {'turns/s':>9}"
        print(f"{'builder':<13} {header}")
        for name in BUILDERS:
            build = get_builder(name)
            result = build(session.captures)
            tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in result.traces)
            memory_s = timed(functools.partial(build, session.captures), repeat)
            store_s = timed(functools.partial(store, name), repeat)
            print(
                f"{name:<13} {len(result.traces):>6} {tokens:>13} {memory_s * 1e3:>10.1f} {turns / memory_s:>9.0f} "
                f"{store_s * 1e3:>9.1f} {turns / store_s:>9.0f}"
            )
        engine.dispose()
        print()
        print_harness_table(url, [rollout_id])


if __name__ == "__main__":
    main()
