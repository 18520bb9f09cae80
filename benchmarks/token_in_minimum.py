"""The least any token-in gateway does on an agent's steady turn, run as a server of its own beside ``polar gateway``.

    .venv/bin/python benchmarks/token_in_minimum.py [--seed 7] [--opening 52000] [--steady-context 80000]

``bench_agent_traffic.py``'s steady goal compares the gateway with the floor: tokenizing a turn's new text and
parsing its body once. A token-in gateway that records every call cannot stop there. This file's minimal gateway
(asyncio and httptools, no framework, ~100 lines) does only the work no such gateway can skip, each turn:

- parse the body (``orjson``);
- check that the conversation's earlier messages are the ones it holds (a digest of their serialisation);
- render the new messages in ChatML and tokenize them;
- serialise the whole prompt's ids for SGLang's ``/generate`` and send them on one kept connection; read the reply;
- commit one row to SQLite (WAL, a durable commit): the prompt's new ids, the sampled ids and their logprobs;
- answer an OpenAI chat completion.

It trusts the echoed reply, parses no tool call, streams nothing, checks no limit, admits nothing, counts nothing,
and has no error path: what it leaves out only makes it cheaper.

Beside it runs a floor server: the same server doing only the floor's work (parse the body, tokenize the new text)
and answering a fixed reply. The floor timed in the benchmark's own process, back to back, is cheaper than the
same work done by any server: a server's core sat idle before each request, and on a 2-core VM the same tokenize
then costs about twice the CPU it costs back to back (its caches were taken by other work meanwhile). The floor
server meets its requests as the gateways meet theirs.

One seeded session (the steady section's conversation) is replayed through the floor server, the minimal gateway
and ``polar gateway``, in that order, in one run. Printed, at the last five turns: each server's CPU per turn
(``/proc/<pid>/task/*/schedstat``), its ratio to the back-to-back floor and to the floor server, and Polar's
ratio to the minimal gateway. The minimal gateway's ratio is what the design itself costs (token-in, a durable
record of every call), before any of Polar's own work; Polar's ratio to it is what Polar adds.

``--load 8,32,96,192,384`` then runs ``bench_agent_traffic.py``'s load section against the same backend: that many
closed-loop agent sessions at once, straight to the backend's chat route (which tokenizes every prompt whole, as an
engine's tokenizer manager does) and through ``polar gateway`` on SQLite and (``--postgres``) Postgres, printing
the throughput each gateway keeps of the direct one beside skyrl-capture's published figures for its proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
from array import array
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httptools
import httpx
import numpy as np
import orjson
import xxhash

from benchmarks.agent_sessions import Corpus, open_session, start_backend, start_gateway
from benchmarks.bench_agent_traffic import postgres_gateway, section_load
from benchmarks.floors import steady_turns
from benchmarks.gateway_support import Server, free_port
from polar.digest import SEED, digest
from polar.settings import get_settings
from polar.tokens.tokenizer import ChatTokenizer, load_tokenizer


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
FLOOR_REPLY = orjson.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok", "tool_calls": []}}], "usage": {}}
)
GENERATE_HEAD = b"POST /generate HTTP/1.1\r\nhost: e\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


def joined_digest(head: bytes, tail: bytes) -> bytes:
    """``digest(orjson.dumps(a + b))`` from ``orjson.dumps(a)`` and ``orjson.dumps(b)``: each list serialised once."""
    if head == b"[]" or tail == b"[]":
        return digest(tail if head == b"[]" else head)
    h = xxhash.xxh3_128(seed=SEED)
    for part in (memoryview(head)[:-1], b",", memoryview(tail)[1:]):
        h.update(part)
    return h.digest()


class Session:
    """What the minimal gateway holds per session: the ids so far and a digest of the messages they stand for."""

    def __init__(self) -> None:
        self.ids = array("i")
        self.known = 0  # messages the ids stand for (the reply's echo not yet among them)
        self.digest = digest(b"[]")  # of the messages known: none yet
        self.seq = 0


class Minimal:
    def __init__(self, tok: ChatTokenizer, backend_port: int, db_path: str, floor_only: bool):
        self.tok, self.backend_port, self.floor_only = tok, backend_port, floor_only
        self.newline = tok.encode("\n")
        self.sessions: dict[bytes, Session] = {}
        self.db = sqlite3.connect(db_path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        columns = "session BLOB, seq INT, request TEXT, delta BLOB, output BLOB, logprobs BLOB"
        self.db.execute(f"CREATE TABLE captures ({columns})")
        self.engine: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def turn(self, key: bytes, raw: bytes) -> bytes:
        body = orjson.loads(raw)
        messages = body["messages"]
        if self.floor_only:  # the floor as a server meets it: the body parsed, the new text tokenized, no more
            self.tok.encode(messages[-1]["content"])
            return FLOOR_REPLY
        session = self.sessions.setdefault(key, Session())
        seen, rest = orjson.dumps(messages[: session.known]), orjson.dumps(messages[session.known :])
        if digest(seen) != session.digest:
            raise RuntimeError("the history changed: this minimal gateway handles appended turns only")
        new = messages[session.known + 1 :] if session.known else messages  # past the echo of its reply
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in new)
        delta = array("i", self.tok.encode(text + "<|im_start|>assistant\n"))
        if session.known:
            session.ids.extend(self.newline)  # after the reply's <|im_end|>
        session.ids.extend(delta)
        reply = await self.generate(np.frombuffer(session.ids, dtype=np.int32))
        output = reply["output_ids"]
        logprobs = array("f", [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]])
        self.db.execute(
            "INSERT INTO captures VALUES (?, ?, ?, ?, ?, ?)",
            (key, session.seq, orjson.dumps(new).decode(), delta.tobytes(), array("i", output).tobytes(), logprobs),
        )  # sqlite3 opens the transaction; the commit below makes it durable (synchronous=FULL)
        self.db.commit()
        session.seq += 1
        session.ids.extend(output)
        session.known = len(messages)
        session.digest = joined_digest(seen, rest)
        message = {"role": "assistant", "content": reply["text"], "tool_calls": []}
        return orjson.dumps(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(session.ids) - len(output), "completion_tokens": len(output)},
            }
        )

    async def generate(self, ids: np.ndarray) -> dict[str, Any]:
        if self.engine is None:
            self.engine = await asyncio.open_connection("127.0.0.1", self.backend_port)
        reader, writer = self.engine
        sampling = {"max_new_tokens": 64, "temperature": 1.0}
        body = orjson.dumps(
            {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}, option=orjson.OPT_SERIALIZE_NUMPY
        )
        writer.writelines([GENERATE_HEAD % len(body), body])
        headers = (await reader.readuntil(b"\r\n\r\n")).lower().split(b"\r\n")
        length = next(int(line[15:]) for line in headers if line.startswith(b"content-length:"))
        return orjson.loads(await reader.readexactly(length))


class Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools, answered in order."""

    def __init__(self, app: Minimal):
        self.app, self.parser = app, httptools.HttpRequestParser(self)
        self.url, self.key, self.body = b"", b"", []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.key = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        raw, self.body = b"".join(self.body), []
        asyncio.get_running_loop().create_task(self.answer(raw))

    async def answer(self, raw: bytes) -> None:
        try:
            out = b"{}" if self.url.startswith(b"/health") else await self.app.turn(self.key, raw)
        except Exception as exc:  # noqa: BLE001 -- the benchmark's client shows it
            error = repr(exc).encode()
            self.transport.write(b"HTTP/1.1 500 Error\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error))
            return
        self.transport.write(OK_HEAD % len(out) + out)


async def serve(port: int, backend_port: int, db_path: str, floor_only: bool) -> None:
    app = Minimal(load_tokenizer("small", get_settings().cache_dir), backend_port, db_path, floor_only)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(app), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# ---- the benchmark --------------------------------------------------------------------------------------------


def start_minimal(stack: ExitStack, tmp: Path, name: str, backend: Server, *flags: str) -> Server:
    port = free_port()
    argv = [sys.executable, __file__, "--serve", str(port), "--backend-port", str(backend.port)]
    argv += ["--db", str(tmp / f"{name}.db"), *flags]
    server = Server(name, argv, env=dict(os.environ), log_dir=tmp, port=port, ready_path="/health")
    stack.callback(server.stop)
    server.wait_ready()
    return server


async def run(args: argparse.Namespace) -> None:
    tok = load_tokenizer("small", get_settings().cache_dir)
    corpus = Corpus(tok)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        backend = start_backend(stack, tmp, args.context)
        servers = {
            "floor server": start_minimal(stack, tmp, "floor", backend, "--floor-only"),
            "minimal token-in gateway": start_minimal(stack, tmp, "minimal", backend),
            "polar gateway": start_gateway(stack, tmp, "gateway", backend, f"sqlite:///{tmp / 'gateway' / 'polar.db'}"),
        }
        async with httpx.AsyncClient(timeout=600) as client:
            arms = {}
            for name, server in servers.items():
                key = await open_session(client, server) if name == "polar gateway" else name
                arms[name] = (await steady_turns(client, server, key, tok, corpus, args))[-5:]
    cpu = {name: statistics.median(r[1] for r in rows) for name, rows in arms.items()}
    floor = statistics.median(r[2] for rows in arms.values() for r in rows)
    first, last = arms["polar gateway"][0][0], arms["polar gateway"][-1][0]
    print(f"== one steady session, {args.opening} -> {args.steady_context} tokens, ~{args.delta} new tokens a turn ==")
    print(f"CPU per turn, median of the last 5 ({first}-{last} tokens); the floor back to back here {ms(floor)}")
    print(f"{'':26s} {'CPU per turn':>12s} {'/ floor here':>13s} {'/ floor server':>15s}")
    for name, took in cpu.items():
        print(f"{name:26s} {ms(took):>12s} {took / floor:12.2f}x {took / cpu['floor server']:14.2f}x")
    print(f"polar gateway / minimal token-in gateway: {cpu['polar gateway'] / cpu['minimal token-in gateway']:.2f}x")
    if args.load:
        await load(args, corpus)


SKYRL_KEPT = {96: 0.96, 192: 0.85, 384: 0.51}
"""The throughput skyrl-capture publishes for its proxy against its direct engine, at these concurrent sessions."""


async def load(args: argparse.Namespace, corpus: Corpus) -> None:
    """Throughput kept at each of ``args.load`` concurrent sessions (``bench_agent_traffic.section_load``)."""
    args.sessions = args.load
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        backend = start_backend(stack, tmp, args.context)
        db = f"sqlite:///{tmp / 'gateway' / 'polar.db'}"
        gateways = {"gateway sqlite": start_gateway(stack, tmp, "gateway", backend, db)}
        if args.postgres:
            gateways["gateway postgres"] = postgres_gateway(stack, tmp, backend, args.postgres)
        await section_load(backend, gateways, corpus, args)
    print("skyrl-capture's proxy, as published: " + ", ".join(f"{k:.0%} kept at {n}" for n, k in SKYRL_KEPT.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--context", type=int, default=450_000, help="the backend's context window")
    p.add_argument("--opening", type=int, default=52_000)
    p.add_argument("--delta", type=int, default=2_000)
    p.add_argument("--steady-context", type=int, default=80_000)
    p.add_argument("--load", type=lambda s: [int(x) for x in s.split(",") if x], default=[], help="sessions, e.g. 8,32")
    p.add_argument("--load-turns", type=int, default=4, help="turns per session in the load section (cap)")
    p.add_argument("--load-scale", type=float, default=0.2, help="token sizes of the load section, x the traces'")
    p.add_argument("--subagent-share", type=float, default=0.2)
    p.add_argument("--postgres", default=os.environ.get("POLAR_TEST_POSTGRES_URL", ""), help="a Postgres URL")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # run the minimal gateway on this port
    p.add_argument("--backend-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--floor-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    asyncio.run(serve(args.serve, args.backend_port, args.db, args.floor_only) if args.serve else run(args))


if __name__ == "__main__":
    main()
