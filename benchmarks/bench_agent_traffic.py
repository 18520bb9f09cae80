"""The gateway on agent-sized traffic: 50k-token openings, ~2k tokens of tool output per turn, 100k+ contexts.

    .venv/bin/python benchmarks/bench_agent_traffic.py [--seed 7] [--sessions 8,32] [--load-turns 6]
        [--steady-context 80000] [--cold 10000,50000] [--big-cold 400000] [--memory-sessions 4]
        [--postgres URL] [--workers-compare] [--only steady,cold,isolation,memory,load]

Sessions are shaped like published Claude Code traces (391 sessions, as replayed by SkyRL's skyrl-capture): an
opening drawn around 50k tokens, per-turn growth around 1.6k tokens (input p50 ~99k after a median of 31 turns),
turn counts around 31, and a share of sessions fanning out a sub-agent whose answer comes back as a tool result.
Everything is drawn from ``--seed``. Tool results are slices of this repository's own code and docs, so the
tokenizer sees realistic bytes. The gateway (``polar gateway``, the tiny model's chat format and tokenizer) runs
in a process of its own in front of ``instant_backend.py`` (context raised to ``--context``); the direct arm
sends the same chat bodies to the backend's chat route, which tokenizes them (``--tokenize-chat``), as a real
engine's tokenizer manager does.

CPU is the gateway's own (``/proc/<pid>/task/*/schedstat``) and the floor is timed in this process's CPU time in
the same run, so the ratios hold on a loaded machine. Sections:

- steady: one session from its opening to ``--steady-context`` tokens; gateway CPU per turn at the last turns
  against the floor (tokenize the turn's new text, and four other slices of its size, each once: text the
  tokenizer has not seen, as the gateway's is; + ``orjson.loads`` the body once, median of 5). Beside it, the
  work token-in adds to any gateway's turn: the whole prompt's ids serialised and written to a socket
  (``benchmarks/floors.py``), and the ratio to the floor with it. And the floor's work timed as a server meets a
  request, each piece after a 20 ms idle gap (on a 2-core VM the same work costs up to twice the CPU after one),
  with the ratio to it; ``token_in_minimum.py`` serves that work from a server of its own.
- cold: the first call of sessions opening at each ``--cold`` size against tokenizing the opening once (the
  first time, as the gateway meets it).
- isolation: another session's small call while a ``--big-cold`` token opening is counted (``count_tokens``: the
  gateway's decode, render and tokenize alone), then while it is a cold start (its baseline beside).
- memory: the heap each open session keeps at ~100k tokens (tracemalloc, the gateway in this process) against
  its id array (4 bytes per token), and the gateway process's RSS growth per session.
- load: closed-loop sessions at each ``--sessions`` concurrency, direct and gateway: turns/s, p50/p90/p99 and
  throughput kept, on SQLite and (``--postgres``) Postgres; ``--workers-compare`` adds ``--workers 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import httpx
import orjson
import sqlalchemy as sa

from benchmarks.agent_sessions import (
    CONTROL,
    TOOLS,
    Conversation,
    Corpus,
    call,
    group_run_s,
    lognormal,
    open_session,
    start_backend,
    start_gateway,
)
from benchmarks.floors import IdsWire, cpu_after_idle, cpu_once, steady_turns
from benchmarks.gateway_support import Server, drop_schema, percentile, schema_url
from benchmarks.session_heap import heap_per_session
from polar.settings import get_settings
from polar.tokens.tokenizer import ChatTokenizer, load_tokenizer


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.2f} ms"


# ---- sections ----------------------------------------------------------------------------------------------


async def section_steady(client: httpx.AsyncClient, gw: Server, tok: ChatTokenizer, corpus: Corpus, args) -> None:
    wire, idle_rng = IdsWire(tok, corpus), random.Random(args.seed + 200)

    def beside(raw: bytes, reply: dict[str, Any]) -> tuple[float, float]:
        """The wire work of the turn's prompt, and the floor's work after an idle gap each (text not seen before)."""
        unseen = [corpus.take(idle_rng, args.delta) for _ in range(5)]
        idle = statistics.median(cpu_after_idle(tok.encode, text) for text in unseen)
        idle += statistics.median(cpu_after_idle(orjson.loads, raw) for _ in range(5))
        return wire.cpu(reply["usage"]["prompt_tokens"]), idle

    rows = await steady_turns(client, gw, await open_session(client, gw), tok, corpus, args, beside)
    context = rows[-1][0]
    last = rows[-5:]
    cpu = statistics.median(r[1] for r in last)
    floor = statistics.median(r[2] for r in last)
    sent = statistics.median(r[3] for r in last)
    print(f"== steady turns: one session, {args.opening} -> {context} tokens, ~{args.delta}-token delta per turn ==")
    print(f"gateway CPU per turn (median of the last 5, ~{last[0][0]}-{last[-1][0]} tokens): {ms(cpu)}")
    print(f"floor (tokenize the new text, first time, + parse the body once):    {ms(floor)}")
    print(f"ratio to the floor: {cpu / floor:.2f}x (goal <= 1.5x)")
    print(
        f"+ the prompt's ids serialised and written to a socket, which token-in cannot skip: {ms(sent)}; "
        f"the floor with them {ms(floor + sent)}, ratio {cpu / (floor + sent):.2f}x"
    )
    idle = statistics.median(r[4] for r in last)
    print(
        f"the floor's work after a 20 ms idle gap, as a server meets a request: {ms(idle)}, ratio {cpu / idle:.2f}x "
        "(benchmarks/token_in_minimum.py serves it, beside a minimal token-in gateway)"
    )
    all_ratios = sorted(r[1] / r[2] for r in rows)
    print(
        f"all {len(rows)} turns: ratio quartiles {percentile(all_ratios, 25):.2f} / {percentile(all_ratios, 50):.2f} / "
        f"{percentile(all_ratios, 75):.2f}x"
    )


async def section_cold(client: httpx.AsyncClient, gw: Server, tok: ChatTokenizer, corpus: Corpus, args) -> None:
    print("== cold start by opening size: the first call of a session ==")
    for size in args.cold:
        took, floors = [], []
        for rep in range(3):  # a different opening each time: nothing cached from an earlier session's
            conv = Conversation(corpus, random.Random(args.seed + size + rep), size)
            text = "\n".join(m["content"] for m in conv.messages) + orjson.dumps(TOOLS).decode()
            floors.append(cpu_once(tok.encode, text))  # the first time, as the gateway meets it
            raw = orjson.dumps(conv.body())
            key = await open_session(client, gw)
            before = gw.run_s()
            await call(client, gw.url, raw, key)
            took.append(gw.run_s() - before)
        cpu, floor = statistics.median(took), statistics.median(floors)
        print(
            f"opening {size:7d} tokens: gateway CPU {ms(cpu)}, tokenize once {ms(floor)}, "
            f"ratio {cpu / floor:.2f}x (goal <= 1.3x at 50k)"
        )


async def section_isolation(client: httpx.AsyncClient, gw: Server, corpus: Corpus, args) -> None:
    rng = random.Random(args.seed + 1)
    small_key = await open_session(client, gw)
    small = Conversation(corpus, rng, 200)
    raw_small = orjson.dumps(small.body())
    await call(client, gw.url, raw_small, small_key)

    async def small_calls(until: asyncio.Event | None, n: int) -> list[float]:
        took: list[float] = []
        while (until is None and len(took) < n) or (until is not None and not until.is_set()):
            started = time.perf_counter()
            await call(client, gw.url, raw_small, small_key)  # same body: a retry of the same turn
            took.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)
        return took

    # A long text first, so that the gateway's tokenizing child (started on the first) is up before measuring.
    warm = anthropic_opening(Conversation(corpus, rng, 100_000))
    await client.post(gw.url + "/v1/messages/count_tokens", json=warm, headers={"authorization": f"Bearer {small_key}"})
    await asyncio.sleep(3)
    baseline = await small_calls(None, 20)
    # Two openings of the same size, so neither finds the other's text in the tokenizer's caches.
    raw_big = orjson.dumps(Conversation(corpus, rng, args.big_cold).body())
    count_big = orjson.dumps(anthropic_opening(Conversation(corpus, rng, args.big_cold)))
    big_key = await open_session(client, gw)
    done = asyncio.Event()

    async def big_call(path: str, raw: bytes) -> float:
        started = time.perf_counter()
        try:
            headers = {"content-type": "application/json", "authorization": f"Bearer {big_key}"}
            reply = await client.post(gw.url + path, content=raw, headers=headers)
            if reply.status_code != 200:
                raise RuntimeError(f"{path}: {reply.status_code} {reply.text[:300]}")
        finally:
            done.set()
        return time.perf_counter() - started

    print(
        f"== isolation: a small call in one session while another session's {args.big_cold}-token opening is worked =="
    )
    print(f"small call baseline: p50 {ms(statistics.median(baseline))}, max {ms(max(baseline))}")
    # The gateway's own work alone (decode, render, tokenize: count_tokens records and forwards nothing), then a
    # whole cold start, whose /generate of 400k ids and whose capture the small calls' own wait behind in the
    # backend and the store they share with it.
    for what, path, raw in (
        ("count_tokens of it (decode, render, tokenize)", "/v1/messages/count_tokens", count_big),
        ("its cold start (and the backend and store it shares)", "/v1/chat/completions", raw_big),
    ):
        done.clear()
        big_took, loaded = await asyncio.gather(big_call(path, raw), small_calls(done, 0))
        added = max(loaded) - statistics.median(baseline) if loaded else 0.0
        goal = " (goal <= 20 ms)" if path.endswith("count_tokens") else ""
        print(
            f"during {what}: {big_took * 1e3:.0f} ms wall ({len(raw) / 1e6:.1f} MB body); {len(loaded)} small calls, "
            f"p50 {ms(statistics.median(loaded) if loaded else 0)}, worst added delay {ms(added)}{goal}"
        )


def anthropic_opening(conv: Conversation) -> dict[str, Any]:
    """A cold opening (system + one user message) as an Anthropic Messages body, for ``count_tokens``."""
    system, user = conv.messages[0]["content"], conv.messages[1]["content"]
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    return {"model": "instant", "system": system, "messages": [{"role": "user", "content": user}], "tools": tools}


async def section_memory(client: httpx.AsyncClient, gw: Server, backend: Server, corpus: Corpus, args) -> None:
    """RSS growth of the gateway process per open session, and the heap each session keeps (``session_heap``): for
    sessions of a ~95k-token opening and one 5k-token turn, and for sessions of 20 turns of ~4k tokens."""
    rng = random.Random(args.seed + 2)

    async def session(client: httpx.AsyncClient, url: str, key: str, opening: int, turns: int, delta: int) -> int:
        """An opening of ``opening`` tokens, then ``turns`` tool round trips of ``delta``; returns its tokens."""
        conv = Conversation(corpus, rng, opening)
        reply = await call(client, url, orjson.dumps(conv.body()), key)
        for _ in range(turns):
            conv.add_turn(reply, delta)
            reply = await call(client, url, orjson.dumps(conv.body()), key)
        return int(reply["usage"]["prompt_tokens"]) + int(reply["usage"]["completion_tokens"])

    warm = Conversation(corpus, rng, 2000)
    await call(client, gw.url, orjson.dumps(warm.body()), await open_session(client, gw))
    before = gw.rss_kib()
    n_tokens = 0
    for _ in range(args.memory_sessions):
        n_tokens += await session(client, gw.url, await open_session(client, gw), 95_000, 1, 5000)
    grown = (gw.rss_kib() - before) * 1024 / args.memory_sessions
    ids = n_tokens * 4 / args.memory_sessions
    print(f"== memory: {args.memory_sessions} open sessions at ~{n_tokens // args.memory_sessions} tokens ==")
    for label, shape in (("a 95k opening and a 5k turn", (95_000, 1, 5000)), ("20 turns of 4k", (10_000, 20, 4000))):
        with tempfile.TemporaryDirectory() as folder:
            heap, tokens, top = await heap_per_session(
                Path(folder),
                backend.url,
                args.memory_sessions,
                lambda c, key, shape=shape: session(c, "http://gateway", key, *shape),
            )
        print(
            f"{label}: heap kept per open session {heap / 1024:.0f} KiB, its id array {tokens * 4 / 1024:.0f} KiB: "
            f"{heap / (tokens * 4):.2f}x (goal <= 1.5x; tracemalloc, the gateway in this process)"
        )
        print("  largest: " + ", ".join(f"{where} {size / 1024:.0f} KiB" for where, size in top))
    print(
        f"RSS growth per open session {grown / 1024:.0f} KiB: {grown / ids:.2f}x its id array (the allocator's "
        "high-water mark from the cold starts' transient buffers included)"
    )


def draw_session(rng: random.Random, args) -> tuple[int, list[int], int | None]:
    """(opening tokens, per-turn tool tokens, turn of a sub-agent fan-out or None), scaled by ``--load-scale``."""
    s = args.load_scale
    opening = lognormal(rng, 50_000 * s, 0.5, 2000 * s, args.context / 3)
    turns = min(args.load_turns, lognormal(rng, 31, 0.6, 3, 200))
    deltas = [lognormal(rng, 1600 * s, 0.9, 50, 30_000 * s) for _ in range(turns)]
    fan = rng.randrange(1, turns) if turns > 1 and rng.random() < args.subagent_share else None
    return opening, deltas, fan


async def aio_call(http: aiohttp.ClientSession, url: str, raw: bytes, key: str | None) -> dict[str, Any]:
    """``call`` on aiohttp: at 96 sessions httpx's pool spent 10-20 ms of the load generator's CPU a turn, more than
    the gateway, and the load generator, not the servers, set the pace."""
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    async with http.post(url + "/v1/chat/completions", data=raw, headers=headers) as reply:
        body = await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{url}: {reply.status} {body[:300]!r}")
    return orjson.loads(body)


async def aio_open_session(http: aiohttp.ClientSession, gateway: Server) -> str:
    async with http.post(gateway.url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL}"}) as r:
        r.raise_for_status()
        return str((await r.json())["api_key"])


async def run_load(http: aiohttp.ClientSession, url: str, gw: Server | None, corpus: Corpus, n: int, args):
    """``n`` concurrent sessions; returns (latencies, wall s); a session that fails ends there (printed)."""
    rng = random.Random(args.seed * 1000 + n)
    shapes = [draw_session(rng, args) for _ in range(n)]
    latencies: list[float] = []
    errors: list[str] = []

    async def session(index: int, opening: int, deltas: list[int], fan: int | None) -> str:
        srng = random.Random(args.seed * 7919 + index)
        key = await aio_open_session(http, gw) if gw else None
        conv = Conversation(corpus, srng, opening)
        reply: dict[str, Any] = {}
        for turn, delta in enumerate([0, *deltas]):
            if turn:
                result = None
                if fan == turn:  # a sub-agent: its own session, its answer the parent's tool result
                    sub = [lognormal(srng, 1200 * args.load_scale, 0.8, 50, 8000) for _ in range(3)]
                    result = await session(index + 10_000, opening // 5, sub, None)
                conv.add_turn(reply, delta, result)
            raw = orjson.dumps(conv.body())
            started = time.perf_counter()
            try:
                reply = await aio_call(http, url, raw, key)
            except (aiohttp.ClientError, RuntimeError) as exc:  # counted and printed; the session ends here
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                break
            latencies.append(time.perf_counter() - started)
        return corpus.take(srng, 500)

    started = time.perf_counter()
    await asyncio.gather(*(session(i, *shape) for i, shape in enumerate(shapes)))
    wall = time.perf_counter() - started
    if errors:
        print(f"  {len(errors)} sessions ended on an error, first: {errors[0]}")
    return latencies, wall


async def section_load(backend: Server, gateways: dict[str, Server], corpus: Corpus, args) -> None:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(600)
    ) as http:
        await _load(http, backend, gateways, corpus, args)


async def _load(
    http: aiohttp.ClientSession, backend: Server, gateways: dict[str, Server], corpus: Corpus, args
) -> None:
    print(
        f"== load: closed-loop sessions (openings ~{int(50_000 * args.load_scale)} tokens, <= {args.load_turns} "
        f"turns, {args.subagent_share:.0%} fan out a sub-agent) =="
    )
    for n in args.sessions:
        spent = (backend.run_s(), time.process_time())
        lat, wall = await run_load(http, backend.url, None, corpus, n, args)
        direct = len(lat) / wall
        print(
            f"{n:3d} sessions  direct          {direct:7.1f} turns/s  p50 {ms(percentile(lat, 50))}  "
            f"p90 {ms(percentile(lat, 90))}  p99 {ms(percentile(lat, 99))}  {_others(backend, spent, len(lat))}"
        )
        for name, gw in gateways.items():
            cpu0, spent = group_run_s(gw), (backend.run_s(), time.process_time())
            glat, gwall = await run_load(http, gw.url, gw, corpus, n, args)
            rate = len(glat) / gwall
            print(
                f"{n:3d} sessions  {name:15s} {rate:7.1f} turns/s  p50 {ms(percentile(glat, 50))}  "
                f"p90 {ms(percentile(glat, 90))}  p99 {ms(percentile(glat, 99))}  kept {rate / direct:.0%}  "
                f"p99 added {ms(percentile(glat, 99) - percentile(lat, 99))}  "
                f"gateway CPU/turn {ms((group_run_s(gw) - cpu0) / len(glat))}  {_others(backend, spent, len(glat))}"
            )


def _others(backend: Server, spent: tuple[float, float], turns: int) -> str:
    """The backend's and this load generator's CPU per turn since ``spent`` (the three share the machine's cores)."""
    return (
        f"backend CPU/turn {ms((backend.run_s() - spent[0]) / turns)}  "
        f"load CPU/turn {ms((time.process_time() - spent[1]) / turns)}"
    )


def postgres_gateway(stack: ExitStack, tmp: Path, backend: Server, url: str) -> Server:
    """A gateway on a Postgres schema of its own, dropped when ``stack`` closes (after the gateway stops)."""
    schema = f"bench_agent_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url)
    with admin.begin() as db:
        db.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    stack.callback(admin.dispose)
    stack.callback(drop_schema, admin, schema)
    return start_gateway(stack, tmp, "gateway-pg", backend, schema_url(url, schema))


async def run(args) -> None:
    tok = load_tokenizer("small", get_settings().cache_dir)
    corpus = Corpus(tok)
    print(
        f"corpus: {len(corpus.text) / 1e6:.1f} MB of this repository's code and docs, "
        f"{corpus.chars_per_token:.2f} chars per token; seed {args.seed}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-agent-"))
    only = set(args.only.split(","))
    with ExitStack() as stack:
        backend = start_backend(stack, tmp, args.context)
        gw = start_gateway(stack, tmp, "gateway-sqlite", backend, f"sqlite:///{tmp / 'gateway-sqlite' / 'polar.db'}")
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1000)) as client:
            if "steady" in only:
                await section_steady(client, gw, tok, corpus, args)
            if "cold" in only:
                await section_cold(client, gw, tok, corpus, args)
            if "isolation" in only:
                await section_isolation(client, gw, corpus, args)
            if "memory" in only:
                await section_memory(client, gw, backend, corpus, args)
            if "load" in only:
                gateways = {"gateway sqlite": gw}
                if args.postgres:
                    gateways["gateway postgres"] = postgres_gateway(stack, tmp, backend, args.postgres)
                if args.workers_compare:
                    db = f"sqlite:///{tmp / 'gateway-w2' / 'polar.db'}"
                    gateways["gateway sqlite w2"] = start_gateway(stack, tmp, "gateway-w2", backend, db, workers=2)
                await section_load(backend, gateways, corpus, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--context", type=int, default=450_000, help="the backend's context window")
    p.add_argument("--opening", type=int, default=52_000, help="steady section: the opening's tokens")
    p.add_argument("--delta", type=int, default=2_000, help="steady section: tool tokens added per turn")
    p.add_argument("--steady-context", type=int, default=80_000)
    p.add_argument("--cold", type=ints, default=[10_000, 50_000])
    p.add_argument("--big-cold", type=int, default=400_000)
    p.add_argument("--memory-sessions", type=int, default=4)
    p.add_argument("--sessions", type=ints, default=[8, 32])
    p.add_argument("--load-turns", type=int, default=4, help="turns per session in the load section (cap)")
    p.add_argument("--load-scale", type=float, default=0.2, help="token sizes of the load section, x the traces'")
    p.add_argument("--subagent-share", type=float, default=0.2)
    p.add_argument("--postgres", default=os.environ.get("POLAR_TEST_POSTGRES_URL", ""), help="a Postgres URL")
    p.add_argument("--workers-compare", action="store_true", help="also a gateway with --workers 2")
    p.add_argument("--only", default="steady,cold,isolation,memory,load")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
