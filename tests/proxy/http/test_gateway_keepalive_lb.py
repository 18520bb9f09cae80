"""Keep-alive through a real load balancer: HAProxy with an idle timeout shorter than a call's silence cuts the
call (a 504) when the gateway sends nothing, and lets it complete when the gateway keeps it alive, for the
OpenAI, Anthropic and google-genai SDKs, streamed and not.

CI scales the times down (a 2 s idle timeout, 6 s calls); the issue's case, a 300-second call through a 60-second
idle timeout, is the same test with ``POLAR_TEST_LB_IDLE_S=60 POLAR_TEST_LONG_CALL_S=300``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from tests.haproxy import HAProxy, haproxy_binary
from tests.proxy.call.test_gateway_overload import SlowBackend
from tests.proxy.gateway_server import GatewayServer, settings_for

IDLE_S = float(os.environ.get("POLAR_TEST_LB_IDLE_S", "2"))
CALL_S = float(os.environ.get("POLAR_TEST_LONG_CALL_S", "6"))
MESSAGES = [{"role": "user", "content": "hi"}]

pytestmark = pytest.mark.skipif(
    haproxy_binary() is None and os.environ.get("CI") != "true", reason="haproxy is not installed (make tools)"
)


class LongBackend(SlowBackend):
    delay_s = CALL_S  # nothing at all comes back for this long: a long prefill, a deep queue


def _behind_haproxy(tmp_path_factory, cache_dir, engine, keepalive_s: float):
    tmp = tmp_path_factory.mktemp("lb")
    settings = settings_for(tmp, cache_dir, keepalive_s=keepalive_s)
    with GatewayServer(settings, backend=LongBackend(engine)) as gateway:
        with HAProxy(gateway.url.removeprefix("http://"), idle_s=IDLE_S, workdir=tmp) as lb:
            yield gateway, lb


@pytest.fixture(scope="module")
def kept_alive(tmp_path_factory, cache_dir, engine):
    yield from _behind_haproxy(tmp_path_factory, cache_dir, engine, keepalive_s=IDLE_S / 4)


@pytest.fixture(scope="module")
def silent(tmp_path_factory, cache_dir, engine):
    yield from _behind_haproxy(tmp_path_factory, cache_dir, engine, keepalive_s=0)


def _session(gateway: GatewayServer, lb: HAProxy) -> tuple[dict, dict[str, str]]:
    session = gateway.session()
    return session, {k: v.replace(gateway.url, lb.url) for k, v in session["base_urls"].items()}


def test_without_keepalive_the_load_balancer_cuts_the_call(silent):
    gateway, lb = silent
    session, _ = _session(gateway, lb)
    body = {"model": "tiny", "max_tokens": 3, "messages": MESSAGES}
    reply = httpx.post(
        lb.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {session['api_key']}"},
        timeout=CALL_S + 30,
    )
    assert reply.status_code == 504, reply.text  # HAProxy's own gateway timeout after IDLE_S of silence


def test_each_sdk_completes_a_long_call_through_the_load_balancer(kept_alive):
    gateway, lb = kept_alive
    session, urls = _session(gateway, lb)
    key = session["api_key"]
    oai = openai.OpenAI(base_url=urls["openai"], api_key=key, max_retries=0, timeout=CALL_S + 60)
    ant = anthropic.Anthropic(base_url=urls["anthropic"], api_key=key, max_retries=0, timeout=CALL_S + 60)
    goo = genai.Client(api_key=key, http_options=gtypes.HttpOptions(base_url=urls["gemini"]))
    config = gtypes.GenerateContentConfig(max_output_tokens=3)

    def ant_stream() -> str | None:
        with ant.messages.stream(model="tiny", max_tokens=3, messages=MESSAGES) as stream:
            return stream.get_final_message().stop_reason

    calls: dict[str, Callable[[], object]] = {
        "openai": lambda: (
            oai.chat.completions.create(model="tiny", max_tokens=3, messages=MESSAGES).choices[0].finish_reason
        ),
        "openai stream": lambda: (
            list(oai.chat.completions.create(model="tiny", max_tokens=3, messages=MESSAGES, stream=True))[-1]
            .choices[0]
            .finish_reason
        ),
        "anthropic": lambda: ant.messages.create(model="tiny", max_tokens=3, messages=MESSAGES).stop_reason,
        "anthropic stream": ant_stream,
        "gemini": lambda: (
            goo.models.generate_content(model="tiny", contents="hi", config=config).candidates[0].finish_reason
        ),
        "gemini stream": lambda: (
            list(goo.models.generate_content_stream(model="tiny", contents="hi", config=config))[-1]
            .candidates[0]
            .finish_reason
        ),
    }

    def timed(call: Callable[[], object]) -> tuple[object, float]:
        started = time.monotonic()
        return call(), time.monotonic() - started

    with ThreadPoolExecutor(len(calls)) as pool:  # all at once: one CALL_S wait for the six
        futures = {name: pool.submit(timed, call) for name, call in calls.items()}
        finished = {name: future.result(timeout=CALL_S + 120) for name, future in futures.items()}
    assert all(reason is not None for reason, _ in finished.values()), finished
    assert all(wall >= CALL_S > IDLE_S for _, wall in finished.values()), finished  # silent past the idle timeout
    for client in (oai, ant, goo):
        client.close()
    captures = gateway.captures(session["session_id"])
    assert len(captures) == len(calls) and all(c["status"] == "OK" for c in captures)
