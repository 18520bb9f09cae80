"""Section 3 of bench_gateway_scale.py (streaming calls in flight at once), and the helpers every section uses to
talk to a gateway: its control token, a session's key, its metrics, and an aiohttp call."""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time

import aiohttp
import httpx
import orjson
from gateway_support import Server, chat_body, closed_loop, conversation, echo, ms
from prometheus_client.parser import text_string_to_metric_families

CONTROL = "bench-" + secrets.token_urlsafe(12)
AUTH = {"Authorization": f"Bearer {CONTROL}"}


async def session_key(client: httpx.AsyncClient, gateway: Server) -> str:
    reply = await client.post(gateway.url + "/v1/sessions", json={}, headers=AUTH)
    reply.raise_for_status()
    return reply.json()["api_key"]


async def scrape(client: httpx.AsyncClient, gateway: Server) -> dict[tuple[str, tuple], float]:
    text = (await client.get(gateway.url + "/metrics", headers=AUTH)).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def histogram_quantile(samples: dict, name: str, labels: dict[str, str], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` (as Prometheus's histogram_quantile, coarse)."""
    buckets = sorted(
        (float(dict(k[1])["le"]), v)
        for k, v in samples.items()
        if k[0] == name + "_bucket" and all(dict(k[1]).get(a) == b for a, b in labels.items())
    )
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("nan")


async def aio_post(http: aiohttp.ClientSession, url: str, body: dict, key: str | None) -> dict:
    headers = {"content-type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    async with http.post(url, data=orjson.dumps(body), headers=headers) as reply:
        data = await reply.read()
    if reply.status != 200:
        raise RuntimeError(f"{url}: HTTP {reply.status}: {data[:300]!r}")
    return orjson.loads(data)


async def section_in_flight(
    client: httpx.AsyncClient, servers: dict[str, Server], n: int, ramp_s: float, next_calls: bool
) -> None:
    gateway = servers["sqlite"]
    arrival = "all sent at once" if ramp_s == 0 else f"sent over {ramp_s:g} s"
    which = "each session's next call" if next_calls else "each session's first call"
    print(
        f"\n== 3. {n} streaming calls in flight at once, {which}, {arrival} (SQLite gateway, backend 20 ms per "
        "token, 50 tokens each, aiohttp load) =="
    )
    keys = [await session_key(client, gateway) for _ in range(n)]
    first = chat_body(conversation(9), max_tokens=64)
    bodies = [orjson.dumps({**first, "stream": True})] * n
    if next_calls:  # each session's first call (not streamed, not measured), as a fleet mid-rollout has made

        async def warm(i: int) -> None:
            said = echo(await aio_post(http, gateway.url + "/v1/chat/completions", first, keys[i]))
            result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": "ok"}
            bodies[i] = orjson.dumps(chat_body([*first["messages"], said, result], max_tokens=64, stream=True))

        pending = iter(range(n))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await closed_loop(64, n, lambda _: warm(next(pending)))
    await client.post(servers["upstream"].url + "/bench/config", json={"stream_token_delay_ms": 20, "reply": "long"})
    rss_before = gateway.rss_kib()
    before = await scrape(client, gateway)
    cpu_before = gateway.cpu_s()
    errors: list[str] = []
    lengths: list[int] = []
    open_now, peak = 0, 0

    async def one(http: aiohttp.ClientSession, i: int, key: str) -> None:
        nonlocal open_now, peak
        await asyncio.sleep(ramp_s * i / n)
        headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
        open_now += 1
        peak = max(peak, open_now)
        try:
            async with http.post(gateway.url + "/v1/chat/completions", data=bodies[i], headers=headers) as reply:
                text = (await reply.read()).decode()
            if reply.status != 200 or "[DONE]" not in text or '"error"' in text:
                errors.append(f"HTTP {reply.status}: {text[:120]}")
            lengths.append(text.count("data: "))
        except aiohttp.ClientError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            open_now -= 1

    started = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
    ) as http:
        await asyncio.gather(*(one(http, i, k) for i, k in enumerate(keys)))
    wall = time.perf_counter() - started
    after = await scrape(client, gateway)
    cpu = gateway.cpu_s() - cpu_before
    rss_after = gateway.rss_kib()
    await client.post(servers["upstream"].url + "/bench/config", json={"stream_token_delay_ms": 0, "reply": "tool"})
    ok_key = ("polar_gateway_calls_total", (("outcome", "ok"), ("protocol", "openai_chat")))
    ok = after[ok_key] - before.get(ok_key, 0)
    during = {k: v - before.get(k, 0) for k, v in after.items()}  # this section's observations only
    lag = {
        q: histogram_quantile(during, "polar_event_loop_lag_seconds", {"server": "gateway"}, q) for q in (0.5, 0.99, 1)
    }
    print(
        f"wall {wall:.1f} s, most in flight at once {peak}, errors {len(errors)}, committed (ok calls) {ok:.0f} of "
        f"{n}, frames per stream {statistics.median(lengths) if lengths else 0:.0f}, gateway CPU {cpu:.1f} s "
        f"({cpu * 1000 / n:.1f} ms per streamed call)"
    )
    if errors:
        print(f"first error: {errors[0]}")
    memory = (
        f"memory per open session {(rss_after - rss_before) / n:.1f} KiB (RSS after - before, {n} sessions of one call)"
        if ramp_s == 0 and not next_calls
        else "(memory: see the first run; this one's sessions fill what the allocator kept from it)"
    )
    lags = f"p50 <= {ms(lag[0.5])} ms, p99 <= {ms(lag[0.99])} ms, worst <= {ms(lag[1])} ms (bucket bounds)"
    print(f"event-loop lag during the streams: {lags}; {memory}")
