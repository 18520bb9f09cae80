"""How fast the web UI shows a long rollout: a synthetic 200-turn session of about 100k tokens (branches,
compactions, sub-agents, truncations, failed calls, weight updates: ``tests.trajectory.synthetic``) against a
10-turn one measured in the same run.

Prints, for each: the server's render time of ``/ui/rollouts/<id>`` (median of runs, in process through the
ASGI app), the page's size, and, when Debian's chromium is installed, the browser's time from navigation to
the load event and to the first paint of the page (headless Chromium via Playwright, the system browser).

    .venv/bin/python benchmarks/bench_ui.py [--turns 200] [--tool-chars 1500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

from db import migrate
from db.engine import make_engine, make_session_factory, session_scope
from db.enums import RolloutStatus
from db.models import Rollout, Task
from flows.dispatch import run_inline
from polar.api import create_api
from polar.serving.threaded import ServerThread
from polar.settings import Settings, TaskDispatch, get_settings
from polar.tokens.tokenizer import load_tokenizer
from polar.trajectory.store import build_and_store
from tests.trajectory.synthetic import RandomChooser, SessionShape, SessionSimulator, write_session


def make_rollout(factory, tokenizer, turns: int, tool_chars: int, seed: int) -> tuple[str, int, int]:
    """A COMPLETED rollout holding one synthetic session; returns its id, captures and stored trace tokens."""
    shape = dataclasses.replace(SessionShape(), tool_output_chars=tool_chars, reply_words=(8, 40))
    session = SessionSimulator(tokenizer, RandomChooser(seed), shape=shape).run(turns)
    with session_scope(factory) as db:
        task = Task(
            name=f"bench-{turns}",
            instruction="bench",
            harness={"name": "synthetic"},
            runtime={},
            evaluator={},
            num_samples=1,
        )
        db.add(task)
        db.flush()
        rollout = Rollout(task_id=task.id, status=RolloutStatus.COMPLETED, reward=1.0)
        db.add(rollout)
        db.flush()
        write_session(db, rollout.id, session)
        rollout_id = rollout.id
    with session_scope(factory) as db:
        result = build_and_store(db, rollout_id, builder="prefix_merge")
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in result.traces)
    return rollout_id, len(session.captures), tokens


def server_ms(client: TestClient, path: str, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        reply = client.get(path)
        times.append(time.perf_counter() - started)
        reply.raise_for_status()
        size = len(reply.content)
    return statistics.median(times) * 1e3, size


def browser_ms(base: str, path: str, repeat: int) -> tuple[float, float] | None:
    executable = shutil.which("chromium")
    if executable is None:
        return None
    from playwright.sync_api import sync_playwright

    loads, paints = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        for _ in range(repeat):
            page = browser.new_page()  # a fresh page each time, so first paint is recorded for each load
            page.goto(base + path, wait_until="load")
            timing = page.evaluate(
                "() => { const n = performance.getEntriesByType('navigation')[0];"
                " const p = performance.getEntriesByName('first-contentful-paint')[0];"
                " return [n.loadEventEnd - n.startTime, p ? p.startTime : -1]; }"
            )
            loads.append(timing[0])
            paints.append(timing[1])
            page.close()
        browser.close()
    return statistics.median(loads), statistics.median(paints)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tool-chars", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        migrate.upgrade(url)
        engine = make_engine(url)
        factory = make_session_factory(engine)
        settings = Settings(
            home=Path(tmp), cache=get_settings().cache_dir, database_url=url, task_dispatch=TaskDispatch.INLINE
        )
        tokenizer = load_tokenizer("small", settings.cache_dir)
        cases = {
            "baseline 10 turns": make_rollout(factory, tokenizer, 10, 400, 1),
            f"{args.turns} turns": make_rollout(factory, tokenizer, args.turns, args.tool_chars, 0),
        }
        app = create_api(settings, factory, run_inline=run_inline)
        client = TestClient(app)
        server = ServerThread(app, lifespan="off")
        with server:
            print(
                f"median of {args.repeat}; server = render of /ui/rollouts/<id> in process; browser = headless chromium"
            )
            header = f"{'rollout':<18} {'captures':>8} {'trace tokens':>12} {'server ms':>9} {'page KB':>8}"
            print(header + f" {'load ms':>8} {'first paint ms':>14}")
            results = {}
            for name, (rollout_id, n_captures, tokens) in cases.items():
                path = f"/ui/rollouts/{rollout_id}"
                ms, size = server_ms(client, path, args.repeat)
                browser = browser_ms(server.url, path, args.repeat)
                load, paint = browser if browser is not None else (float("nan"), float("nan"))
                results[name] = (ms, load)
                print(
                    f"{name:<18} {n_captures:>8} {tokens:>12} {ms:>9.1f} {size // 1024:>8} {load:>8.0f} {paint:>14.0f}"
                )
            (base_ms, base_load), (long_ms, long_load) = results.values()
            print(f"ratio long/baseline: server {long_ms / base_ms:.1f}x, browser load {long_load / base_load:.1f}x")
            if browser is None:
                print("(chromium not installed: browser columns are nan; scripts/browser_env.sh installs it)")
        engine.dispose()


if __name__ == "__main__":
    main()
