"""Prometheus metrics of the gateway and the control API (``GET /metrics``, control token as Bearer).

One set per process, in prometheus_client's default registry (several gateways in one process share it).
Names and labels (docs/gateway.md lists them):

- ``polar_gateway_calls_total{protocol, outcome}``: finished model calls; outcome ``ok`` or the error type.
- ``polar_gateway_added_latency_seconds{protocol}``: a call's time in the gateway beyond the backend's
  generation (decode, auth, prompt, capture commit); ``polar_gateway_ttft_seconds{protocol}``: arrival to the
  first generated chunk of a stream.
- ``polar_gateway_tokens_total{direction}``: prompt (``in``) and sampled (``out``) tokens.
- ``polar_capture_commit_batch_size`` and ``polar_capture_commit_seconds``: the group commit's rows per
  transaction and its duration; ``polar_capture_commit_wait_seconds``: a call's wait for its commit.
- ``polar_backend_in_flight{backend, server}``, ``polar_backend_queued{backend, server}``: calls generating and
  waiting for a slot on each inference server (``backend``: its kind, ``server``: its URL, or the kind for the
  in-process model); ``polar_backend_overloaded_total{backend, server}``: calls refused after waiting.
- ``polar_event_loop_lag_seconds{server}``: how late a 10 ms timer fires on the server's event loop (a hundred
  samples a second: a p99 over a few seconds is not just the worst one).
- ``polar_store_errors_total{server}``, ``polar_backend_errors_total{type}``.
- ``polar_alarms_total{kind}``: alarms raised (``polar.alarms``), by the batch flow that fired them or, for a
  silent gateway, by the control API's live view.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

_FAST = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

CALLS = Counter("polar_gateway_calls", "Finished model calls", ["protocol", "outcome"])
ADDED_LATENCY = Histogram(
    "polar_gateway_added_latency_seconds", "Time in the gateway beyond generation", ["protocol"], buckets=_FAST
)
TTFT = Histogram("polar_gateway_ttft_seconds", "Arrival to the first generated chunk", ["protocol"], buckets=_SLOW)
TOKENS = Counter("polar_gateway_tokens", "Prompt (in) and sampled (out) tokens", ["direction"])
COMMIT_BATCH = Histogram(
    "polar_capture_commit_batch_size", "Captures per commit", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
COMMIT_SECONDS = Histogram("polar_capture_commit_seconds", "One group commit", buckets=_FAST)
COMMIT_WAIT = Histogram("polar_capture_commit_wait_seconds", "A call's wait for its capture commit", buckets=_FAST)
IN_FLIGHT = Gauge("polar_backend_in_flight", "Calls generating on the inference server", ["backend", "server"])
QUEUED = Gauge("polar_backend_queued", "Calls waiting for an in-flight slot", ["backend", "server"])
OVERLOADED = Counter("polar_backend_overloaded", "Calls refused after waiting for a slot", ["backend", "server"])
LOOP_LAG = Histogram("polar_event_loop_lag_seconds", "Event-loop lag", ["server"], buckets=_FAST)
STORE_ERRORS = Counter("polar_store_errors", "Store failures", ["server"])
BACKEND_ERRORS = Counter("polar_backend_errors", "Backend failures", ["type"])
ALARMS = Counter("polar_alarms", "Alarms raised", ["kind"])


def observe_commit(batch_size: int, seconds: float) -> None:
    COMMIT_BATCH.observe(batch_size)
    COMMIT_SECONDS.observe(seconds)


def track(backend: str, server: str, in_flight: Callable[[], float], queued: Callable[[], float]) -> None:
    """Read the in-flight and queued counts of inference server ``server`` (of kind ``backend``) at each scrape."""
    IN_FLIGHT.labels(backend, server).set_function(in_flight)
    QUEUED.labels(backend, server).set_function(queued)


def exposition() -> tuple[bytes, str]:
    """The text format body and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST


@contextlib.asynccontextmanager
async def loop_lag_monitor(server: str, period_s: float = 0.01) -> AsyncIterator[None]:
    """While open, measure how late a ``period_s`` timer fires on the running loop (each sample costs microseconds;
    at 100 ms, a run of a few seconds had too few samples for its p99 to be anything but its worst)."""

    async def watch() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(period_s)
            LOOP_LAG.labels(server).observe(max(0.0, loop.time() - before - period_s))

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
