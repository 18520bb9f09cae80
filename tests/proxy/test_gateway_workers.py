"""``polar gateway --workers 2``: two processes on one port; one session's calls, each on a new connection (so the
kernel spreads them over both), keep a dense seq and an append-mode chain."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import CONTROL
from tests.proxy.gateway_server import free_port

TURNS = 6
SCRIPT = {"type": "scripted", "replies": [{"content": f"reply {i}"} for i in range(TURNS)]}
TOOLS = [{"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}}]


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_two_workers_share_a_port_and_a_session(tmp_path, cache_dir):
    port = free_port()
    env = {
        **os.environ,
        "POLAR_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
        "POLAR_CACHE": str(cache_dir),
        "POLAR_HOME": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar.cli", "gateway", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # both workers up: each prints its start line once it serves
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200 and len(_children(proc.pid)) == 2:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(proc.communicate()[0].decode(errors="replace")[-3000:])
            time.sleep(0.3)
        time.sleep(3)  # the second worker's gateway may still be loading its model
        session = httpx.post(url + "/v1/sessions", json={"policy": SCRIPT}, headers=CONTROL).json()
        messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
        for turn in range(TURNS):
            reply = httpx.post(  # a new connection every call
                url + "/v1/chat/completions",
                json={"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 4},
                headers={"Authorization": f"Bearer {session['api_key']}"},
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
            content = reply.json()["choices"][0]["message"]["content"]
            assert content == f"reply {turn}"
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        captures = httpx.get(f"{url}/v1/sessions/{session['session_id']}/captures", headers=CONTROL).json()["captures"]
        assert [c["seq"] for c in captures] == list(range(TURNS))
        for parent, child in itertools.pairwise(captures):
            assert child["parent_id"] == parent["id"] and child["render_mode"] == "append"
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert output.count("polar gateway on") == 2, output
