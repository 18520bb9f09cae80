"""Section 4 of bench_gateway_scale.py: the capture writer alone, in this process.

Captures/s committed with group commit from many sessions on Postgres (the median of ``ROUNDS`` rounds), with this
process's CPU per capture, printed beside the disk's fsync latency and a one-row commit's, so a slow disk is visible
and not blamed on the code. Then the cost of one commit (``section_commit_cost``): the writer storing one capture at
a time, as a session's calls reach it, against the floor, the same rows encoded, inserted and committed one per
transaction on one connection of the same store, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import statistics
import time
from array import array

from sqlalchemy import Engine
from store_latency import commit_s, fsync_ms, pg_data_dir

from db import Capture, Rollout, make_engine, make_session_factory
from polar.inference import FinishReason, GenerateResult, LogprobSemantics, SamplingParams, VersionSpan
from polar.proxy.capture import sql as capture_sql
from polar.proxy.capture.row import capture_row
from polar.proxy.capture.writer import CaptureWriter
from polar.settings import RenderMode
from polar.tokens.render import Prompt

ROUNDS = 3


def rollouts(factory, n: int) -> list[str]:
    """``n`` new rollout rows' ids."""
    ids = []
    with factory() as db, db.begin():
        for _ in range(n):
            row = Rollout()
            db.add(row)
            db.flush()
            ids.append(row.id)
    return ids


def row(rollout_id: str, prompt_ids: int = 300, output_ids: int = 50) -> Capture:
    """A capture of an agent's turn: a prompt delta of ``prompt_ids`` and ``output_ids`` sampled."""
    result = GenerateResult(
        tuple(range(output_ids)),
        tuple([-0.5] * output_ids),
        FinishReason.STOP,
        None,
        (VersionSpan("v0", 0, output_ids),),
        prompt_ids,
        LogprobSemantics.TEMPERATURE_SCALED,
    )
    return capture_row(
        rollout_id=rollout_id,
        seq=-1,
        protocol="openai_chat",
        model="tiny",
        backend="sglang",
        request_json={"messages": [{"role": "user", "content": "x" * 200}]},
        prompt=Prompt(array("i", range(prompt_ids)), RenderMode.APPEND),
        sampling=SamplingParams(),
        result=result,
        response_json={"id": "x"},
    )


def section_writer(pg_url: str, n: int, sessions: int) -> None:
    engine = make_engine(pg_url)
    factory = make_session_factory(engine)
    ids = rollouts(factory, sessions)
    writer = CaptureWriter(factory, max_batch=512)

    async def main() -> list[float]:
        rows = [row(ids[i % sessions]) for i in range(n)]
        await asyncio.gather(*(writer.write(r, timeout_s=120) for r in rows[:200]))  # warm-up
        rates = []
        for part in range(ROUNDS):  # rounds: a checkpoint or another process's burst moves one, not the figure
            chunk = rows[200 + part * (n - 200) // ROUNDS : 200 + (part + 1) * (n - 200) // ROUNDS]
            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(writer.write(r, timeout_s=120) for r in chunk))
            rates.append(len(chunk) / (time.perf_counter() - started))
            cpu_per_capture.append((time.process_time() - cpu) / len(chunk))
        return rates

    commits = writer.commits
    cpu_per_capture: list[float] = []  # this process's CPU (the callers and the writer thread) per capture
    rates = asyncio.run(main())
    writer.close()
    commit_ms = statistics.median(commit_s(engine, ids[0]) for _ in range(50)) * 1000
    engine.dispose()
    print(f"\n== 4. the capture writer alone on Postgres: {n - 200} captures from {sessions} sessions ==")
    print(
        f"{statistics.median(rates):.0f} captures/s committed (median of {ROUNDS} rounds: "
        f"{', '.join(f'{r:.0f}' for r in rates)}), {writer.commits - commits} transactions (group commit); "
        f"{statistics.median(cpu_per_capture) * 1e6:.0f} us of this process's CPU per capture (callers and writer "
        "thread: steadier than the rate on a shared machine)"
    )
    print(
        f"this machine's disk: fsync of 8 KiB p50 {fsync_ms(pg_data_dir(pg_url)):.2f} ms; a one-row commit on this "
        f"Postgres p50 {commit_ms:.2f} ms (each batch pays one: a slow disk lowers the figure above, not the code)"
    )


def section_commit_cost(urls: dict[str, str], n: int) -> None:
    """Per store: this process's CPU per capture for the writer storing ``n`` captures one at a time (each awaited,
    a session's calls one after another) and for the floor (the same rows encoded, inserted and committed, one per
    transaction, on one connection: no counter, no key check, no thread), the median of ``ROUNDS`` rounds each."""
    print(f"\n== 4b. one capture at a time, {n} a round: the writer against a plain insert and commit ==")
    for name, url in urls.items():
        engine = make_engine(url)
        factory = make_session_factory(engine)
        [rollout_id] = rollouts(factory, 1)
        writer = CaptureWriter(factory)
        asyncio.run(_one_at_a_time(writer, [row(rollout_id) for _ in range(50)]))  # warm-up: connection, caches
        ours, floor = [], []
        for part in range(ROUNDS):
            rows = [row(rollout_id) for _ in range(n)]
            cpu = time.process_time()
            asyncio.run(_one_at_a_time(writer, rows))
            ours.append((time.process_time() - cpu) / n)
            rows = [row(rollout_id) for _ in range(n)]
            cpu = time.process_time()
            _plain(engine, rows, 1_000_000 * (part + 1))  # seqs the writer's counter never reaches
            floor.append((time.process_time() - cpu) / n)
        writer.close()
        engine.dispose()
        us, floor_us = statistics.median(ours) * 1e6, statistics.median(floor) * 1e6
        print(
            f"{name:9s} writer {us:6.0f} us of CPU per capture  plain insert and commit {floor_us:6.0f} us  "
            f"{us / floor_us:.2f}x"
        )


async def _one_at_a_time(writer: CaptureWriter, rows: list[Capture]) -> None:
    for capture in rows:
        await writer.write(capture, timeout_s=60)


def _plain(engine: Engine, rows: list[Capture], seq: int) -> None:
    """The floor: each row encoded, inserted and committed in a transaction of its own, on one connection."""
    with engine.connect() as conn:
        for capture in rows:
            encoded = capture_sql.encode_row(capture, conn.dialect)
            with conn.begin():
                capture_sql.insert_rows(conn, [capture_sql.with_seq(encoded, seq)])
            seq += 1
