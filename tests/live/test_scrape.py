"""A gateway's load from two scrapes of its ``/metrics`` (rates between them, a restart counted from its start),
and the gateway states read from heartbeats and answers."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from polar.live.fleet import GatewayEntry, GatewayState, state_of
from polar.live.scrape import load_between, parse


def exposition(ok: int, failed: int, lag: list[float], in_flight: int) -> str:
    """The text a gateway's /metrics serves, from the same metric names in a registry of this test's own."""
    registry = CollectorRegistry()
    calls = Counter("polar_gateway_calls", "", ["protocol", "outcome"], registry=registry)
    calls.labels("openai_chat", "ok").inc(ok)
    calls.labels("anthropic_messages", "backend_timeout").inc(failed)
    Gauge("polar_backend_in_flight", "", ["backend"], registry=registry).labels("sglang").set(in_flight)
    Gauge("polar_backend_queued", "", ["backend"], registry=registry).labels("sglang").set(2)
    histogram = Histogram("polar_event_loop_lag_seconds", "", ["server"], registry=registry)
    for value in lag:
        histogram.labels("gateway").observe(value)
    histogram.labels("api").observe(5.0)  # the control API's loop, not the gateway's
    return generate_latest(registry).decode()


def test_rates_between_two_scrapes_and_after_a_restart():
    first, in_flight, queued = parse(exposition(10, 0, [0.001, 0.003], 3), at=100.0)
    load = load_between(first, None, in_flight, queued)
    assert load.calls_per_s is None and load.error_rate == 0.0 and load.calls == 10
    assert abs(load.loop_lag_s - 0.002) < 1e-12 and load.in_flight == {"sglang": 3} and load.queued == {"sglang": 2}
    second, in_flight, queued = parse(exposition(28, 2, [0.001, 0.003, 0.010, 0.010], 1), at=104.0)
    load = load_between(second, first, in_flight, queued)
    assert load.calls_per_s == 5.0 and load.error_rate == 0.1 and abs(load.loop_lag_s - 0.010) < 1e-12
    restarted, in_flight, queued = parse(exposition(4, 0, [0.002], 0), at=106.0)
    load = load_between(restarted, second, in_flight, queued)  # counters went down: since its start
    assert load.calls_per_s is None and load.calls == 4 and load.error_rate == 0.0


def test_states_from_heartbeat_answer_and_stop():
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def entry(silent_s: float, stopped: bool = False) -> GatewayEntry:
        return GatewayEntry("h:1", "http://h:1", at, silent_s, stopped, at)

    assert state_of(entry(1.0), 30.0, answered=True) is GatewayState.UP
    assert state_of(entry(1.0), 30.0, answered=False) is GatewayState.DRAINING
    assert state_of(entry(31.0), 30.0, answered=False) is GatewayState.DOWN
    assert state_of(entry(1.0, stopped=True), 30.0, answered=False) is GatewayState.STOPPED
