"""Each gateway's load, read from its own ``/metrics`` (Prometheus text, the control token as Bearer): calls in
flight and queued per inference server URL (the ``server`` label), calls per second and error rate since the
previous scrape, and event-loop lag.

Rates need two scrapes: ``Scraper`` keeps each gateway's last totals, so the first look at a gateway shows its
totals since it started, and each later one the rates over the time in between. A gateway that does not answer
within ``timeout_s`` has no load (the live view shows it DRAINING while its heartbeat is fresh).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Totals:
    """The counters of one scrape."""

    at: float
    calls: float
    errors: float
    lag_sum: float
    lag_count: float


@dataclass(frozen=True)
class GatewayLoad:
    in_flight: dict[str, float]  # per inference server URL
    queued: dict[str, float]
    calls_per_s: float | None  # None on the first scrape
    error_rate: float | None  # failed / finished calls since the previous scrape (or since start)
    loop_lag_s: float | None  # mean lag of the loop's 10 ms timer since the previous scrape (or since start)
    calls: int  # finished calls since the gateway started


def parse(text: str, at: float) -> tuple[Totals, dict[str, float], dict[str, float]]:
    calls = errors = lag_sum = lag_count = 0.0
    in_flight: dict[str, float] = {}
    queued: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "polar_gateway_calls_total":
                calls += sample.value
                if labels.get("outcome") != "ok":
                    errors += sample.value
            elif sample.name == "polar_backend_in_flight":
                in_flight[labels.get("server") or labels.get("backend", "")] = sample.value
            elif sample.name == "polar_backend_queued":
                queued[labels.get("server") or labels.get("backend", "")] = sample.value
            elif sample.name == "polar_event_loop_lag_seconds_sum" and labels.get("server") == "gateway":
                lag_sum += sample.value
            elif sample.name == "polar_event_loop_lag_seconds_count" and labels.get("server") == "gateway":
                lag_count += sample.value
    return Totals(at, calls, errors, lag_sum, lag_count), in_flight, queued


def load_between(
    now: Totals, before: Totals | None, in_flight: dict[str, float], queued: dict[str, float]
) -> GatewayLoad:
    base = before or Totals(now.at, 0.0, 0.0, 0.0, 0.0)
    calls, errors = now.calls - base.calls, now.errors - base.errors
    lag_n = now.lag_count - base.lag_count
    if calls < 0 or lag_n < 0:  # the gateway restarted between scrapes: count from its start
        return load_between(now, None, in_flight, queued)
    elapsed = now.at - base.at
    return GatewayLoad(
        in_flight=in_flight,
        queued=queued,
        calls_per_s=calls / elapsed if before is not None and elapsed > 0 else None,
        error_rate=errors / calls if calls > 0 else None,
        loop_lag_s=(now.lag_sum - base.lag_sum) / lag_n if lag_n > 0 else None,
        calls=int(now.calls),
    )


class Scraper:
    """Scrapes gateways, remembering each one's previous totals (one per control-API process)."""

    def __init__(self, token: str | None, timeout_s: float = 1.0):
        self.token = token
        self.timeout_s = timeout_s
        self._last: dict[str, Totals] = {}

    async def _one(self, client: httpx.AsyncClient, gateway_id: str, url: str) -> GatewayLoad | None:
        try:
            reply = await client.get(url.rstrip("/") + "/metrics")
            reply.raise_for_status()
        except httpx.HTTPError:
            return None
        totals, in_flight, queued = parse(reply.text, time.monotonic())
        load = load_between(totals, self._last.get(gateway_id), in_flight, queued)
        self._last[gateway_id] = totals
        return load

    async def scrape(self, gateways: Sequence[tuple[str, str]]) -> dict[str, GatewayLoad | None]:
        """``(id, url)`` pairs to each one's load (None: it did not answer)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers) as client:
            loads = await asyncio.gather(*(self._one(client, gid, url) for gid, url in gateways))
        return dict(zip((gid for gid, _ in gateways), loads, strict=True))
