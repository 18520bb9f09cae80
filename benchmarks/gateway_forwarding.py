"""Sections 1 and 2 of bench_gateway.py: what the gateway adds in front of a backend on one call.

``section_latency`` prints table 1 (p50/p99 over the direct call and requests/s, against the instant backend,
for Polar's gateway and the LiteLLM proxy, from 1 and 16 concurrent connections); ``section_ttfb`` prints
table 2 (time to first byte, first token and end of a stream, direct ``/generate`` vs the gateway's chat
route). ``LITELLM_KEY`` is the master key the script starts the LiteLLM proxy with.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid

import httpx
from gateway_sessions import new_session
from gateway_support import KIB, Server, chat_body, closed_loop, conversation, ms, percentile, post_json

from polar.settings import get_settings
from polar.tokens.render import PromptBuilder
from polar.tokens.template import ChatTemplate
from polar.tokens.tokenizer import ChatTokenizer
from polar.wire import OPENAI_CHAT

LITELLM_KEY = f"sk-bench-{uuid.uuid4().hex}"  # LiteLLM refuses to start without a master key
TOKEN_DELAY_MS = 20
STREAM_MAX_TOKENS = 8


# ---- 1. added latency and throughput ---------------------------------------------------------------------


async def section_latency(
    client: httpx.AsyncClient, servers: dict[str, Server], levels: list[int], n_requests: int
) -> None:
    body = json.dumps(chat_body(conversation(9))).encode()
    keys = [(await new_session(client, servers["polar"]))[1] for _ in range(max(levels))]
    targets: list[tuple[str, str, list[str | None]]] = [
        ("direct", servers["upstream"].url + "/v1/chat/completions", [None] * max(levels)),
        ("polar", servers["polar"].url + "/v1/chat/completions", list(keys)),
    ]
    if "litellm" in servers:
        targets.append(("litellm", servers["litellm"].url + "/v1/chat/completions", [LITELLM_KEY] * max(levels)))

    def caller(url: str, worker_keys: list[str | None]):
        async def call(worker: int) -> None:
            reply = await post_json(client, url, body, worker_keys[worker])
            if reply.status_code != 200 or b"tool_calls" not in reply.content:
                raise RuntimeError(f"{url}: HTTP {reply.status_code}: {reply.text[:300]}")

        return call

    for _name, url, worker_keys in targets:  # warm-up: connections, lazy imports, caches
        await closed_loop(4, 40, caller(url, worker_keys))
    results: dict[tuple[str, int], tuple[list[float], float]] = {}
    for level in levels:
        for name, url, worker_keys in targets:
            results[name, level] = await closed_loop(
                level, n_requests * (2 if level > 1 else 1), caller(url, worker_keys)
            )

    print(
        f"\n== 1. added latency and throughput, instant backend ({len(json.loads(body)['messages'])}-message agent "
        f"conversation, {len(body) / KIB:.1f} KiB body, tool-call reply) =="
    )
    print(
        "Polar: one session per connection, the same request every call, so each call renders and tokenizes the whole\n"
        "conversation (no parent to append to), streams /generate and commits a capture to SQLite before answering"
    )
    print(
        f"{'target':<8} {'conc':>4} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} "
        f"{'added p99':>10} {'req/s':>8}"
    )
    summary: dict[tuple[str, int], tuple[float, float, float]] = {}
    for level in levels:
        base = results["direct", level][0]
        for name, _url, _keys in targets:
            lat, wall = results[name, level]
            p50, p99 = statistics.median(lat), percentile(lat, 99)
            added50, added99 = p50 - statistics.median(base), p99 - percentile(base, 99)
            summary[name, level] = (added50, added99, len(lat) / wall)
            added = ("-", "-") if name == "direct" else (ms(added50), ms(added99))
            print(
                f"{name:<8} {level:>4} {len(lat):>8} {ms(p50):>8} {ms(p99):>8} {added[0]:>10} {added[1]:>10} "
                f"{len(lat) / wall:>8.0f}"
            )
    if "litellm" in servers:
        for level in levels:
            (p50, p99, rps), (l50, l99, lrps) = summary["polar", level], summary["litellm", level]
            print(
                f"Polar/LiteLLM at conc {level}: added p50 {p50 / l50:.2f}x, added p99 {p99 / l99:.2f}x, req/s "
                f"{rps / lrps:.2f}x"
            )


# ---- 2. time to first byte, streaming --------------------------------------------------------------------


async def stream_times(
    client: httpx.AsyncClient, url: str, body: bytes, key: str | None, is_token
) -> tuple[float, float, float]:
    """Seconds to the first body byte, to the first event carrying a token, and to the end of the stream."""
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    started = time.perf_counter()
    first_byte = first_token = None
    async with client.stream("POST", url, content=body, headers=headers) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
        buffer = b""
        async for chunk in reply.aiter_raw():
            now = time.perf_counter() - started
            first_byte = now if first_byte is None else first_byte
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if first_token is None and line.startswith(b"data: {") and is_token(json.loads(line[6:])):
                    first_token = now
    if first_byte is None or first_token is None:
        raise RuntimeError(f"{url}: the stream carried no token")
    return first_byte, first_token, time.perf_counter() - started


def _generate_token(event: dict) -> bool:
    return bool(event.get("output_ids"))


def _chat_token(event: dict) -> bool:
    choices = event.get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


async def section_ttfb(client: httpx.AsyncClient, servers: dict[str, Server], tokenizer: ChatTokenizer, n: int) -> None:
    chat = chat_body(conversation(9), stream=True, max_tokens=STREAM_MAX_TOKENS)
    parsed = OPENAI_CHAT.parse_request(chat)
    prompt = PromptBuilder(tokenizer, ChatTemplate(get_settings().tool_format)).canonical_ids(
        parsed.messages, parsed.tools
    )
    direct_body = json.dumps(
        {
            "input_ids": list(prompt),
            "sampling_params": {"max_new_tokens": STREAM_MAX_TOKENS},
            "return_logprob": True,
            "stream": True,
        }
    ).encode()
    chat_bytes = json.dumps(chat).encode()
    rows = []
    await client.post(
        servers["upstream"].url + "/bench/config", json={"reply": "text", "stream_token_delay_ms": TOKEN_DELAY_MS}
    )
    try:
        pairs = [(f"instant, {TOKEN_DELAY_MS} ms/token", servers["upstream"], servers["polar"])]
        if "model" in servers:
            pairs.append(("tiny model (serve-model)", servers["model"], servers["polar-model"]))
        for label, backend, gateway in pairs:
            _, key = await new_session(client, gateway)
            paths = [
                ("direct /generate", backend.url + "/generate", direct_body, None, _generate_token),
                ("gateway chat", gateway.url + "/v1/chat/completions", chat_bytes, key, _chat_token),
            ]
            for _ in range(3):  # warm-up
                for _path, url, body, k, is_token in paths:
                    await stream_times(client, url, body, k, is_token)
            samples: dict[str, list[tuple[float, float, float]]] = {path: [] for path, *_ in paths}
            for _ in range(n):  # alternate, so drift hits both paths alike
                for path, url, body, k, is_token in paths:
                    samples[path].append(await stream_times(client, url, body, k, is_token))
            for path, *_ in paths:
                rows.append((label, path, *(statistics.median(s[i] for s in samples[path]) for i in range(3))))
    finally:
        await client.post(servers["upstream"].url + "/bench/config", json={"reply": "tool", "stream_token_delay_ms": 0})

    print(
        f"\n== 2. streaming: time to first byte / first token, direct vs through the gateway "
        f"({len(prompt)}-token prompt, {STREAM_MAX_TOKENS} tokens, p50 of {n}) =="
    )
    print(
        f"{'backend':<26} {'path':<17} {'first byte ms':>13} {'first token ms':>14} {'end ms':>8} "
        f"{'added (token) ms':>16}"
    )
    for i, (label, path, first_byte, first_token, end) in enumerate(rows):
        added = "-" if i % 2 == 0 else ms(first_token - rows[i - 1][3])
        print(f"{label:<26} {path:<17} {ms(first_byte):>13} {ms(first_token):>14} {ms(end):>8} {added:>16}")
