"""``GET /metrics`` in Prometheus text format on the gateway and the control API, behind the control token."""

from __future__ import annotations

import logging
import socket
import time

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from tests.rollout.helpers import test_settings


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_gateway_metrics_count_calls_latency_tokens_commits_and_loop_lag(gateway):
    assert httpx.get(gateway.url + "/metrics").status_code == 401
    session = httpx.post(gateway.url + "/v1/sessions", json={}, headers=gateway.control).json()
    before = _samples(httpx.get(gateway.url + "/metrics", headers=gateway.control).text)
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    key = {"Authorization": f"Bearer {session['api_key']}"}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=key, timeout=60).status_code == 200
    streamed = httpx.post(gateway.url + "/v1/chat/completions", json={**body, "stream": True}, headers=key, timeout=60)
    assert streamed.status_code == 200
    assert httpx.post(gateway.url + "/v1/chat/completions", json=body, headers={"x-api-key": "nope"}).status_code == 401
    time.sleep(0.3)  # a loop-lag sample or more
    reply = httpx.get(gateway.url + "/metrics", headers=gateway.control)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    after = _samples(reply.text)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("polar_gateway_calls_total", protocol="openai_chat", outcome="ok") == 2
    assert grew("polar_gateway_calls_total", protocol="openai_chat", outcome="authentication_error") == 1
    assert grew("polar_gateway_added_latency_seconds_count", protocol="openai_chat") == 2
    assert grew("polar_gateway_ttft_seconds_count", protocol="openai_chat") == 1
    assert grew("polar_gateway_tokens_total", direction="out") >= 2
    assert grew("polar_gateway_tokens_total", direction="in") >= 2
    assert grew("polar_capture_commit_batch_size_count") >= 1
    assert grew("polar_capture_commit_wait_seconds_count") == 2
    assert after[("polar_event_loop_lag_seconds_count", (("server", "gateway"),))] >= 1
    assert ("polar_backend_in_flight", (("backend", "local"), ("server", "local"))) in after
    assert ("polar_backend_queued", (("backend", "local"), ("server", "local"))) in after


def test_a_caller_hanging_up_mid_body_is_counted_as_client_closed_not_an_internal_error(gateway, caplog):
    session = httpx.post(gateway.url + "/v1/sessions", json={}, headers=gateway.control).json()
    metrics_of = lambda: _samples(httpx.get(gateway.url + "/metrics", headers=gateway.control).text)  # noqa: E731
    key = ("polar_gateway_calls_total", (("outcome", "client_closed"), ("protocol", "openai_chat")))
    before = metrics_of().get(key, 0.0)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {session['api_key']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
    )
    with caplog.at_level(logging.WARNING), socket.create_connection(("127.0.0.1", gateway.port)) as conn:
        conn.sendall(head.encode() + b'{"model": "tiny", "messages": [')  # then hangs up, 4,969 bytes short
    deadline = time.monotonic() + 10
    while metrics_of().get(key, 0.0) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics_of().get(key, 0.0) == before + 1
    assert not [r for r in caplog.records if r.name.startswith("polar")], "a hang-up is not a gateway fault"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_control_api_metrics_need_the_token(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token="s3cret", task_dispatch="inline")
    with TestClient(create_api(settings, store_factory(settings), run_inline=run_inline)) as client:
        assert client.get("/metrics").status_code == 401
        reply = client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert reply.status_code == 200
        assert "polar_event_loop_lag_seconds" in reply.text and "polar_store_errors_total" in reply.text
