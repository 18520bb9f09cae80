"""The embedded main job: a small batch of toy tasks × samples through the whole rollout pipeline.

No server is needed: Prefect runs in its ephemeral mode (a temporary local server, state under
``POLAR_HOME/prefect``), the store is the SQLite file in ``POLAR_HOME``, the gateway runs inside this process on
the local model, and each sample runs the built-in agent in the local runtime. Every rollout is a Prefect flow
run with four task runs (init, run, postrun, evaluate); the batch runs them concurrently under the stage limits.

The local model is a tiny random network, so the agent's actions come from a scripted gateway policy per
sample (``policies``): the gateway answers with scripted tool calls, rendered into real token ids and scored by
the real local model, so captures hold true ids and logprobs. Half of the samples are scripted to solve their
task and half to fail it. The demo therefore proves the pipeline (sessions, captures, trajectories, runtimes,
evaluators, rewards, Prefect orchestration), not a trained policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import describe_database, normalize_url
from db.models import Rollout
from flows.prefect_server import prepare_prefect_environment
from polar.auth import token_path
from polar.report.rollouts import RolloutRow, format_groups, format_rollouts, format_totals, rollout_rows
from polar.rollout.context import close_contexts, get_store
from polar.settings import Settings

GIT_COMMIT = "git init -q . && git add -A && git -c user.email=demo@polar -c user.name=polar commit -q -m start"


def _bash(command: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def _script(*commands: str) -> dict[str, Any]:
    return {"type": "scripted", "replies": [*(_bash(c) for c in commands), {"content": "Done."}]}


def toy_tasks(samples: int) -> list[dict[str, Any]]:
    """Three toy tasks; sample i is scripted to solve its task when i is even and to fail it when i is odd."""
    agent = {"name": "agent", "config": {"max_turns": 4}}
    return [
        {
            "name": "write-file",
            "instruction": "Create a file answer.txt that contains the word polar.",
            "harness": agent,
            "evaluator": {"type": "file", "config": {"path": "answer.txt", "equals": "polar"}},
            "num_samples": samples,
            "policies": [_script("echo polar > answer.txt"), _script("echo polaris > answer.txt")],
        },
        {
            "name": "fix-bug",
            "instruction": "add() in calc.py returns the wrong result. Fix it.",
            "harness": agent,
            "runtime": {
                "prepare": [
                    {"type": "write_file", "path": "calc.py", "content": "def add(a, b):\n    return a - b\n"},
                    {"command": GIT_COMMIT},
                ]
            },
            # Graded in a fresh runtime, prepared while the agent runs, with the agent's diff applied.
            "evaluator": {
                "type": "tests",
                "fresh_runtime": True,
                "config": {
                    "command": "{python} -m pytest -q -p no:cacheprovider test_calc.py",
                    "files": {"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
                },
            },
            "num_samples": samples,
            "policies": [
                _script("cat calc.py", "sed -i 's/a - b/a + b/' calc.py"),
                _script("echo '# checked' >> calc.py"),
            ],
        },
        {
            "name": "count-lines",
            "instruction": "Write the number of lines of data.txt into count.txt.",
            "harness": agent,
            "runtime": {"prepare": [{"type": "write_file", "path": "data.txt", "content": "alpha\nbeta\ngamma\n"}]},
            "evaluator": {"type": "command", "config": {"command": "test \"$(tr -d ' ' < count.txt)\" = 3"}},
            "num_samples": samples,
            "policies": [_script("wc -l < data.txt > count.txt"), _script("echo 4 > count.txt")],
        },
    ]


STAGE_OF = {"PENDING": "pending", "INIT": "init", "RUNNING": "run", "POSTRUN": "postrun", "EVALUATING": "evaluate"}


async def _progress(factory: sessionmaker[Session], since: datetime, started: float, stop: asyncio.Event) -> None:
    """One line whenever the rollouts created by this run change stage."""
    last = None
    while not stop.is_set():
        with factory() as db:
            statuses = db.scalars(sa.select(Rollout.status).where(Rollout.created_at >= since)).all()
        counts: dict[str, int] = {}
        for status in statuses:
            key = STAGE_OF.get(status.value, status.value)
            counts[key] = counts.get(key, 0) + 1
        line = " | ".join(
            f"{name} {counts[name]}"
            for name in [*STAGE_OF.values(), "COMPLETED", "ERROR", "TIMEOUT"]
            if counts.get(name)
        )
        if statuses and line != last:
            print(f"[{time.monotonic() - started:6.1f} s] {len(statuses)} rollouts: {line}", flush=True)
            last = line
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


@dataclass(frozen=True)
class BatchRun:
    rows: list[RolloutRow]
    not_run: dict[str, str]  # rollout id -> why this run did not take it to a final status


async def run_batch(settings: Settings, tasks: Sequence[dict[str, Any]], *, title: str) -> BatchRun:
    """Run ``tasks`` through the batch flow in this process, printing progress, the table, and each rollout this
    run did not take to a final status with the reason."""
    prepare_prefect_environment(settings)
    from flows.batch import rollout_batch
    from flows.dispatch import Dispatch

    factory = await get_store(settings)
    # Rows are stamped by the database clock; a second of slack covers a coarse clock on SQLite.
    since = datetime.now(UTC).replace(microsecond=0)
    started = time.monotonic()
    print(title, flush=True)
    print(
        "starting Prefect's temporary server, the gateway and the model (10-20 s on a fresh POLAR_HOME) ...", flush=True
    )
    stop = asyncio.Event()
    monitor = asyncio.create_task(_progress(factory, since, started, stop))
    try:
        summary = await rollout_batch(tasks=list(tasks), dispatch=Dispatch.INLINE)
    finally:
        stop.set()
        await monitor
    rows = rollout_rows(factory, list(summary["tasks"]))
    print(f"\nbatch finished in {time.monotonic() - started:.1f} s\n")
    print(format_rollouts(rows))
    if any(r.sample > 0 for r in rows):  # groups of samples: each task's group at a glance
        print()
        print(format_groups(rows))
    print()
    print(format_totals(rows))
    not_run = summary.get("not_run") or {}
    if not_run:
        print(f"\n{len(not_run)} rollout(s) not run to a final status by this run:")
        for rollout_id, why in not_run.items():
            print(f"  {rollout_id}: {why}")
    return BatchRun(rows, not_run)


def viewer_hint(settings: Settings, rows: Sequence[RolloutRow]) -> str:
    """Where the demo's rollouts can be looked at: ``polar serve`` on the demo's home, then its ``/ui``."""
    base = settings.public_url.rstrip("/") or f"http://{settings.api_host}:{settings.api_port}"
    # The token itself is never printed: the shell reads it from where it is kept.
    token = "$POLAR_CONTROL_TOKEN" if settings.control_token else f"$(cat {token_path(settings)})"
    first = f"\n  one rollout: {base}/ui/rollouts/{rows[0].rollout_id}" if rows else ""
    return (
        "look at these rollouts in the browser:\n"
        f"  POLAR_HOME={settings.home} polar serve\n"
        f'  then open "{base}/ui?token={token}"{first}'
    )


async def run_demo(settings: Settings, samples: int = 4) -> None:
    tasks = toy_tasks(samples)
    title = (
        f"polar demo: {len(tasks)} toy tasks x {samples} samples, built-in agent on scripted policies, "
        f"local model, {describe_database(normalize_url(settings.resolved_database_url))}, Prefect ephemeral mode"
    )
    try:
        run = await run_batch(settings, tasks, title=title)
    finally:
        await asyncio.to_thread(close_contexts)
    print()
    print(viewer_hint(settings, run.rows))
    if run.not_run or any(row.status != "COMPLETED" for row in run.rows):
        raise SystemExit(1)
