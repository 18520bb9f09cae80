"""The sessions and servers of ``bench_agent_traffic.py``: agent conversations cut from this repository's code and
docs (so the tokenizer sees realistic bytes), the instant backend and the gateway under test, and the calls."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.gateway_support import Server, free_port, gateway_env
from polar.models.tiny import ensure_model_dir
from polar.settings import get_settings
from polar.tokens.tokenizer import ChatTokenizer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONTROL = "bench-agent"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}: run it in the repository and return what it prints",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
    for name in ("bash", "read_file", "edit_file", "grep", "run_tests")
]


# ---- realistic text ----------------------------------------------------------------------------------------


class Corpus:
    """This repository's Python and Markdown as one text; ``take`` cuts seeded slices of about n tokens."""

    def __init__(self, tokenizer: ChatTokenizer):
        files = sorted([*ROOT.glob("polar/**/*.py"), *ROOT.glob("docs/*.md"), *ROOT.glob("tests/**/*.py")])
        self.text = "\n".join(f"$ cat {p.relative_to(ROOT)}\n{p.read_text(errors='replace')}" for p in files)
        sample = self.text[:200_000]
        self.chars_per_token = len(sample) / len(tokenizer.encode(sample))

    def take(self, rng: random.Random, tokens: int) -> str:
        n = int(tokens * self.chars_per_token)
        if n >= len(self.text):
            return (self.text * (n // len(self.text) + 1))[:n]
        start = rng.randrange(0, len(self.text) - n)
        return self.text[start : start + n]


def lognormal(rng: random.Random, median: float, sigma: float, low: float, high: float) -> int:
    return int(min(high, max(low, rng.lognormvariate(0, sigma) * median)))


class Conversation:
    """A session's messages as an agent harness keeps them: system + task opening, then tool round trips."""

    def __init__(self, corpus: Corpus, rng: random.Random, opening_tokens: int):
        self.corpus, self.rng = corpus, rng
        system = "You are a coding agent working inside a git repository. Read, edit and test code.\n"
        context = corpus.take(rng, opening_tokens)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system + context},
            {"role": "user", "content": f"Fix the failing test (task {uuid.uuid4().hex[:8]})."},
        ]

    def body(self) -> dict[str, Any]:
        return {"model": "instant", "messages": self.messages, "tools": TOOLS, "max_tokens": 64}

    def add_turn(self, reply: dict[str, Any], tool_tokens: int, result: str | None = None) -> str:
        """The reply's assistant message and a tool result of ~``tool_tokens`` tokens; returns the new text."""
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        call_id = calls[0]["id"] if calls else "call_none"
        output = result if result is not None else self.corpus.take(self.rng, tool_tokens)
        self.messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": output}]
        return output


# ---- servers -----------------------------------------------------------------------------------------------


def start_backend(stack: ExitStack, tmp: Path, context: int) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")} | {
        "POLAR_CACHE": str(get_settings().cache_dir)
    }
    argv = [sys.executable, "benchmarks/instant_backend.py", "--port", str(port), "--context-length", str(context)]
    server = Server("backend", [*argv, "--tokenize-chat"], env=env, log_dir=tmp, port=port, ready_path="/health")
    stack.callback(server.stop)
    server.wait_ready()
    return server


def start_gateway(stack: ExitStack, tmp: Path, name: str, backend: Server, db_url: str, workers: int = 1) -> Server:
    cache = get_settings().cache_dir
    (tmp / name).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "DATABASE_URL"))}
    env |= gateway_env(tmp / name, cache, backend.url, db_url, CONTROL, ensure_model_dir("tiny", cache))
    port = free_port()
    argv = [str(BIN / "polar"), "gateway", "--port", str(port), *(["--workers", str(workers)] if workers > 1 else [])]
    if os.environ.get("BENCH_PROFILE_WRAPPER"):  # e.g. a script running the CLI under cProfile
        argv = [sys.executable, os.environ["BENCH_PROFILE_WRAPPER"], *argv[1:]]
    server = Server(name, argv, env=env, log_dir=tmp, port=port, ready_path="/health/live")
    stack.callback(server.stop)
    server.wait_ready()
    if os.environ.get("BENCH_PYSPY"):  # collapsed stacks of the gateway's threads, for profiling (py-spy)
        spy = [str(BIN / "py-spy"), "record", "-r", "500", "-f", "raw", "-o", os.environ["BENCH_PYSPY"], "--threads"]
        spy += os.environ.get("BENCH_PYSPY_ARGS", "").split()
        proc = subprocess.Popen([*spy, "--pid", str(server.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(proc.wait)
        stack.callback(proc.send_signal, signal.SIGINT)
    return server


async def open_session(client: httpx.AsyncClient, gateway: Server) -> str:
    reply = await client.post(gateway.url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {CONTROL}"})
    reply.raise_for_status()
    return reply.json()["api_key"]


async def call(client: httpx.AsyncClient, url: str, raw: bytes, key: str | None) -> dict[str, Any]:
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    reply = await client.post(url + "/v1/chat/completions", content=raw, headers=headers)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}: {reply.status_code} {reply.text[:300]}")
    return reply.json()


def group_run_s(server: Server) -> float:
    """CPU seconds of every process in the server's process group (``--workers N`` forks N workers)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != server.pid:  # field 5 of /proc/<pid>/stat: the process group
                continue
            for task in (stat.parent / "task").iterdir():
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total
