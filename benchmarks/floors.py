"""What ``bench_agent_traffic.py`` and ``token_in_minimum.py`` measure a gateway against, timed in the benchmark's
own process in the same run: CPU of a function (all threads, or one thread), a steady turn's floor, and the wire
work a token-in gateway cannot skip; and the steady session both replay (``steady_turns``)."""

from __future__ import annotations

import random
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import orjson

from benchmarks.agent_sessions import Conversation, Corpus, call
from benchmarks.gateway_support import Server
from polar.tokens.tokenizer import ChatTokenizer


def cpu_median(fn: Any, repeat: int = 5) -> float:
    """Median CPU seconds of this process (all threads) over ``repeat`` runs of ``fn``."""
    took = []
    for _ in range(repeat):
        started = time.process_time()
        fn()
        took.append(time.process_time() - started)
    return statistics.median(took)


def cpu_once(fn: Any, *args: Any) -> float:
    """CPU seconds of this process for one call ``fn(*args)``."""
    started = time.process_time()
    fn(*args)
    return time.process_time() - started


def turn_floor(tok: ChatTokenizer, corpus: Corpus, rng: random.Random, new: str, raw: bytes, tokens: int) -> float:
    """A steady turn's floor: tokenizing its new text and four other slices of that size, each once (text the
    tokenizer has not seen, as a gateway's is: an encode of the same text again finds its words in the
    tokenizer's cache, ~15% cheaper), the median; + ``orjson.loads`` of the body, median of 5."""
    fresh = [new, *(corpus.take(rng, tokens) for _ in range(4))]
    return statistics.median(cpu_once(tok.encode, text) for text in fresh) + cpu_median(lambda: orjson.loads(raw))


async def steady_turns(
    client: httpx.AsyncClient,
    server: Server,
    key: str,
    tok: ChatTokenizer,
    corpus: Corpus,
    args: Any,
    after: Callable[[bytes, dict[str, Any]], tuple[Any, ...]] = lambda raw, reply: (),
) -> list[tuple[Any, ...]]:
    """One seeded agent session through ``server``, from its ``args.opening`` to ``args.steady_context`` tokens,
    ``args.delta`` new tokens a turn. Per turn after the opening: (context, the server's CPU for the call, the
    turn's floor, *``after(body, reply)``), the last measured outside the call's window."""
    rng, floor_rng = random.Random(args.seed), random.Random(args.seed + 100)
    conv = Conversation(corpus, rng, args.opening)
    context, rows = args.opening, []
    reply = await call(client, server.url, orjson.dumps(conv.body()), key)
    while context < args.steady_context:
        new = conv.add_turn(reply, args.delta)
        context += args.delta
        raw = orjson.dumps(conv.body())
        floor = turn_floor(tok, corpus, floor_rng, new, raw, args.delta)
        before = server.run_s()
        reply = await call(client, server.url, raw, key)
        rows.append((context, server.run_s() - before, floor, *after(raw, reply)))
    return rows


def cpu_after_idle(fn: Any, *args: Any, idle_s: float = 0.02) -> float:
    """CPU seconds of this process for ``fn(*args)`` called after ``idle_s`` asleep, as a server meets a request:
    on a 2-core VM the same work costs up to twice the CPU after an idle gap that it costs back to back."""
    time.sleep(idle_s)
    return cpu_once(fn, *args)


class IdsWire:
    """What a token-in gateway cannot skip beyond the floor, each turn: the whole prompt's ids serialised for the
    engine (``orjson``, as the gateway does) and written to a loopback TCP socket (drained by a thread), timed in
    the writing thread's CPU. Ids are the tokenizer's own, tiled from the corpus, so their digits are realistic."""

    def __init__(self, tok: ChatTokenizer, corpus: Corpus):
        self.sample = np.asarray(tok.encode(corpus.take(random.Random(0), 20_000)), dtype=np.int32)
        listener = socket.create_server(("127.0.0.1", 0))
        self.out = socket.create_connection(listener.getsockname())
        sink, _ = listener.accept()
        listener.close()
        threading.Thread(target=lambda: all(iter(lambda: sink.recv(1 << 20), b"")), daemon=True).start()

    def cpu(self, n_ids: int, repeat: int = 5) -> float:
        ids = np.resize(self.sample, n_ids)
        took = []
        for _ in range(repeat):
            started = time.thread_time()
            self.out.sendall(orjson.dumps({"input_ids": ids}, option=orjson.OPT_SERIALIZE_NUMPY))
            took.append(time.thread_time() - started)
        return statistics.median(took)
