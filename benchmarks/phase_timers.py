"""Per-phase CPU of a gateway's calls: runs ``polar`` with thread-CPU timers around the call pipeline's phases.

    BENCH_PROFILE_WRAPPER=benchmarks/phase_timers.py BENCH_PHASES_OUT=phases.txt \\
        .venv/bin/python benchmarks/bench_agent_traffic.py --only steady

The benchmarks start the gateway as ``python <wrapper> gateway ...`` when ``BENCH_PROFILE_WRAPPER`` is set. Each
phase's time is ``time.thread_time()`` of the thread that ran it, so an async phase counts only the event loop's
own CPU between its start and end: exact for one session calling at a time (the steady section), mixed with other
calls' work under concurrency. Work a phase hands to another thread (a cold start's tokenizing, the capture
writer's commit) is timed where it runs. Written to ``BENCH_PHASES_OUT`` (default ``phases.txt``) when the
gateway stops.
"""

from __future__ import annotations

import atexit
import collections
import functools
import inspect
import os
import signal
import statistics
import sys
import time
from typing import Any

TOTALS: collections.defaultdict[str, list[float]] = collections.defaultdict(list)  # each call's seconds


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by the same callable adding its thread CPU to ``TOTALS[label]``."""
    fn = getattr(owner, name)

    def add(started: float) -> None:
        TOTALS[label].append(time.thread_time() - started)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                add(started)
    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                add(started)

    setattr(owner, name, wrapper)


def install() -> None:
    import polar.backends.sglang as sglang
    from polar.proxy.call.intake import Intake
    from polar.proxy.call.plan import Planner
    from polar.proxy.call.record import CallRecorder
    from polar.proxy.call.service import CallService
    from polar.proxy.capture.writer import CaptureWriter
    from polar.proxy.http import model_routes
    from polar.tokens.tokenizer import ChatTokenizer

    timed(model_routes, "_model_call", "the call's handler (all the phases below on the loop)")
    timed(Intake, "decode", "intake: read, parse, check the body")
    timed(Planner, "plan", "plan: parent, render, admit")
    timed(ChatTokenizer, "encode", "  tokenizer.encode (in plan)")
    timed(ChatTokenizer, "encode_batch", "  tokenizer.encode_batch (cold starts)")
    timed(CallService, "complete", "complete: generate, record, reply")
    timed(sglang.SGLangBackend, "generate", "  backend round trip")
    timed(sglang, "_body_json", "    prompt ids serialised")
    timed(CallRecorder, "reply", "  capture row and reply")
    timed(CaptureWriter, "_commit", "capture commit (writer thread)")


def dump(*_: Any) -> None:
    if not TOTALS:
        return  # no call was timed (``--help``, a gateway that failed to start): nothing to write
    with open(os.environ.get("BENCH_PHASES_OUT", "phases.txt"), "w") as out:
        for label, times in TOTALS.items():
            # The median beside the mean: a session's cold start is one call that moves the mean, not the median.
            total, mean, median = sum(times) * 1e3, sum(times) / len(times) * 1e3, statistics.median(times) * 1e3
            out.write(
                f"{label:42s} calls {len(times):5d}  total {total:9.1f} ms  per call {mean:7.3f} ms  "
                f"median {median:7.3f} ms\n"
            )


def main() -> None:
    install()
    atexit.register(dump)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit runs on the benchmark's stop
    from polar.cli import main as polar

    sys.argv = ["polar", *sys.argv[1:]]
    polar()


if __name__ == "__main__":
    main()
