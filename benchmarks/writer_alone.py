"""Section 4 of bench_gateway_scale.py: the capture writer alone on Postgres, in this process.

Captures/s committed with group commit from many sessions (the median of ``ROUNDS`` rounds), with this process's
CPU per capture, printed beside the disk's fsync latency and a one-row commit's, so a slow disk is visible and not
blamed on the code."""

from __future__ import annotations

import asyncio
import statistics
import time

from store_latency import commit_s, fsync_ms, pg_data_dir

from db import Rollout, make_engine, make_session_factory
from polar.proxy.capture.row import capture_row
from polar.proxy.capture.writer import CaptureWriter

ROUNDS = 3


def section_writer(pg_url: str, n: int, sessions: int) -> None:
    engine = make_engine(pg_url)
    factory = make_session_factory(engine)
    ids = []
    with factory() as db, db.begin():
        for _ in range(sessions):
            row = Rollout()
            db.add(row)
            db.flush()
            ids.append(row.id)
    writer = CaptureWriter(factory, max_batch=512)

    def row(i: int):
        from polar.inference import FinishReason, GenerateResult, LogprobSemantics, SamplingParams, VersionSpan
        from polar.settings import RenderMode
        from polar.tokens.render import Prompt

        result = GenerateResult(
            tuple(range(50)),
            tuple([-0.5] * 50),
            FinishReason.STOP,
            None,
            (VersionSpan("v0", 0, 50),),
            300,
            LogprobSemantics.TEMPERATURE_SCALED,
        )
        return capture_row(
            rollout_id=ids[i % sessions],
            seq=-1,
            protocol="openai_chat",
            model="tiny",
            backend="sglang",
            request_json={"messages": [{"role": "user", "content": "x" * 200}]},
            prompt=Prompt(tuple(range(300)), RenderMode.APPEND),
            sampling=SamplingParams(),
            result=result,
            response_json={"id": "x"},
        )

    async def main() -> list[float]:
        rows = [row(i) for i in range(n)]
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
