"""Helpers for bench_gateway.py (and its sections, gateway_forwarding.py and gateway_sessions.py) and the other
gateway benchmarks: server subprocesses (stopped by their process group), the agent conversation the clients
send, a closed-loop load generator, percentiles and the tables' units (``ms``, ``KIB``).

Every subprocess starts in a session of its own, so stopping it signals exactly that process group (the
server and anything it forked) and nothing else on the machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
MODEL = "instant"
LITELLM_VENV = ROOT / ".venv-litellm"  # scripts/litellm_env.sh builds it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on a loopback port, its output in ``log_dir/<name>.log``."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: dict[str, str], log_dir: Path, port: int, ready_path: str
    ):
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            list(argv), env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} did not answer {self.ready_path} within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def rss_kib(self) -> int:
        """Resident set size of the server process, from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used, from /proc/<pid>/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run_s(self) -> float:
        """Seconds the server process's threads have run on a CPU, to the nanosecond (``/proc/<pid>/task/*/schedstat``;
        ``cpu_s`` counts clock ticks of 10 ms, too coarse for a few calls)."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                continue
        return total / 1e9

    def stop(self) -> None:
        if self.popen.poll() is None:
            with _suppress_gone():
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with _suppress_gone():
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        with _suppress_gone():  # children left in the group after the leader exited
            os.killpg(self.pid, signal.SIGKILL)
        self._log.close()


class _suppress_gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        return exc_type is ProcessLookupError


# ---- the agent conversation ------------------------------------------------------------------------------

SYSTEM = (
    "You are a coding agent working inside a git repository. Use the bash tool to inspect files, run the "
    "tests and edit code. Keep changes small, explain what you did, and stop when the tests pass. "
) * 10
TASK = "The test suite fails on tests/test_parser.py; find the cause and fix it."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return its output",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


def tool_output(turn: int) -> str:
    """A few hundred characters of directory listing, different every turn."""
    return "\n".join(
        f"-rw-r--r-- 1 root root {turn * 37 + i:>6} Nov 29 12:00 src/pkg_{turn}/mod_{i}.py" for i in range(7)
    )


def tool_turn(turn: int, assistant: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """An assistant tool call (the given echo, or a canned one) and its tool result."""
    call_id = assistant["tool_calls"][0]["id"] if assistant else f"call_{turn}"
    assistant = assistant or {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls -la"})},
            }
        ],
    }
    return [assistant, {"role": "tool", "tool_call_id": call_id, "content": tool_output(turn)}]


def conversation(turns: int) -> list[dict[str, Any]]:
    """System + task + ``turns`` tool round trips: 2 + 2 * turns messages."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for turn in range(turns):
        messages += tool_turn(turn)
    return messages


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "tools": TOOLS, **extra}


def echo(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a chat completion, as a harness sends it back."""
    message = response["choices"][0]["message"]
    if not message.get("tool_calls"):
        raise RuntimeError(f"expected a tool call, got {message!r}")
    return {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]}


# ---- load ---------------------------------------------------------------------------------------------


async def closed_loop(
    concurrency: int, n_requests: int, call: Callable[[int], Awaitable[None]]
) -> tuple[list[float], float]:
    """``n_requests`` calls from ``concurrency`` workers, each starting its next call when one returns.
    ``call(worker)`` raises on a bad answer. Returns per-call latencies (s) and the wall time (s)."""
    remaining = n_requests
    latencies: list[float] = []

    async def worker(index: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await call(index)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - started


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


KIB = 1024


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals, the tables' unit."""
    return f"{seconds * 1e3:.2f}"


def post_json(client: httpx.AsyncClient, url: str, body: bytes, key: str | None = None) -> Awaitable[httpx.Response]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return client.post(url, content=body, headers=headers)


def litellm_command(tmp: Path, upstream_url: str, master_key: str) -> tuple[list[str], dict[str, str], int]:
    """argv, environment and port of a LiteLLM proxy forwarding model ``instant`` to ``upstream_url``'s OpenAI
    ``/v1/chat/completions`` (one worker, telemetry and spend logs off); ready at ``/health/liveliness``."""
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": upstream_url + "/v1", "api_key": "none"},
            }
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True},
        "general_settings": {"master_key": master_key, "disable_spend_logs": True},
    }
    (tmp / "litellm.yaml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}
    argv = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"), "--host", "127.0.0.1"]
    return [*argv, "--port", str(port), "--num_workers", "1"], env, port


def gateway_env(
    home: Path, cache: Path, backend_url: str, database_url: str, control_token: str, model_path: Path | None
) -> dict[str, str]:
    """The environment of a ``polar gateway`` on an SGLang-wire backend at ``backend_url`` (the tiny model's
    tokenizer); ``model_path`` is the folder it reads the chat format from (the instant backend names none)."""
    env = {
        "POLAR_HOME": str(home),
        "POLAR_CACHE": str(cache),
        "POLAR_BACKEND": "sglang",
        "POLAR_BACKEND_URL": backend_url,
        "POLAR_MODEL": "tiny",
        "POLAR_DATABASE_URL": database_url,
        "POLAR_CONTROL_TOKEN": control_token,
    }
    return {**env, "POLAR_MODEL_PATH": str(model_path)} if model_path is not None else env


def schema_url(base_url: str, schema: str) -> str:
    """``base_url`` with every connection's search_path on ``schema`` (each run works in a schema of its own)."""
    url = sa.make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


def drop_schema(engine: sa.Engine, schema: str) -> None:
    with engine.begin() as db:
        db.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
