"""The gateway and its store: durability when Postgres goes away, and two gateways sharing one Postgres."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from sqlalchemy import make_url

from polar.backends.local import LocalBackend
from tests.conftest import CONTROL
from tests.pg import POSTGRES_URL, needs_postgres, postgres_schema, schema_url
from tests.proxy.gateway_server import GatewayServer, free_port, settings_for
from tests.proxy.tcp_forwarder import TcpForwarder

pytestmark = needs_postgres
SCRIPT = {
    "type": "scripted",
    "replies": [{"content": "first"}, {"content": "second"}, {"content": "third"}, {"content": "fourth"}],
}
TOOLS = [{"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}}]


def chat(base_url: str, key: str, messages: list, **kw):
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    return client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, **kw)


def test_store_outage_gives_a_provider_503_and_nothing_half_written(tmp_path, cache_dir, engine):
    pg = make_url(POSTGRES_URL)
    forwarder = TcpForwarder(pg.host or "127.0.0.1", pg.port or 5432)
    forwarder.start()
    with postgres_schema() as schema:
        url = schema_url(schema, make_url(POSTGRES_URL).set(port=forwarder.port).render_as_string(hide_password=False))
        with GatewayServer(settings_for(tmp_path, cache_dir, url), backend=LocalBackend(engine)) as gw:
            session = gw.session()
            base, key = session["base_urls"]["openai"], session["api_key"]
            messages = [{"role": "user", "content": "hi"}]
            assert chat(base, key, messages, max_tokens=4).choices[0].message is not None

            forwarder.stop()
            with pytest.raises(openai.APIStatusError) as refused:
                chat(base, key, messages, max_tokens=4)
            assert refused.value.status_code == 503 and refused.value.body["code"] == "store_unavailable"

            # The store goes away *during* a streamed generation: no finished reply may reach the harness.
            forwarder.start()
            stream = httpx.stream(
                "POST",
                f"{base}/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "tiny", "messages": messages, "max_tokens": 400, "stream": True},
                timeout=60,
            )
            with stream as reply:
                lines = reply.iter_lines()
                assert next(lines).startswith("data: ")
                forwarder.stop()
                rest = list(lines)
            assert not any('"finish_reason":"length"' in line or '"finish_reason":"stop"' in line for line in rest)
            assert any('"error"' in line for line in rest)

            forwarder.start()
            assert chat(base, key, messages, max_tokens=4).choices[0].message is not None
            captures = gw.captures(session["session_id"])
            assert [c["status"] for c in captures] == ["OK", "OK"]  # the two calls that were acknowledged
    forwarder.stop()


def test_two_gateway_processes_share_a_session(tmp_path, cache_dir, tiny_model_dir):
    with postgres_schema() as schema:
        url = schema_url(schema)
        env = {**os.environ, "POLAR_DATABASE_URL": url, "POLAR_CACHE": str(cache_dir), "POLAR_HOME": str(tmp_path)}
        ports = [free_port(), free_port()]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "polar.cli", "gateway", "--port", str(p)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for p in ports
        ]
        try:
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            deadline = time.monotonic() + 90
            for u in urls:
                while True:
                    try:
                        if httpx.get(u + "/health", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        dead = [p for p in procs if p.poll() is not None]
                        if dead or time.monotonic() > deadline:
                            for p in procs:
                                p.kill()
                            output = "\n".join(p.communicate()[0].decode(errors="replace")[-3000:] for p in procs)
                            raise AssertionError(f"a gateway did not start:\n{output}") from None
                    time.sleep(0.2)
            session = httpx.post(urls[0] + "/v1/sessions", json={"policy": SCRIPT}, headers=CONTROL).json()
            messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
            for turn in range(4):
                reply = chat(urls[turn % 2] + "/v1", session["api_key"], messages)
                assert reply.choices[0].message.content == SCRIPT["replies"][turn]["content"]
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"next {turn}"},
                ]
            captures = httpx.get(
                f"{urls[1]}/v1/sessions/{session['session_id']}/captures", params={"full_prompt": True}, headers=CONTROL
            ).json()["captures"]
            assert [c["seq"] for c in captures] == [0, 1, 2, 3]
            for parent, child in itertools.pairwise(captures):
                assert child["parent_id"] == parent["id"] and child["render_mode"] == "append"
                assert child["prefix_len"] == len(parent["prompt_ids"]) + len(parent["output_ids"])
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.communicate(timeout=20)  # waits and closes its pipe
