"""Keep-alive for long calls: a non-streaming call silent past ``keepalive_s`` gets spaces before its JSON body,
a stream empty SSE lines before its first token, and each official SDK reads the answer as usual (google-genai
would fail on SSE comments: its reader takes any other line for JSON)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from tests.proxy.call.test_gateway_overload import SlowBackend
from tests.proxy.gateway_server import GatewayServer, settings_for

KEEPALIVE_S = 0.2


class SlowerBackend(SlowBackend):
    delay_s = 1.0  # five keep-alive periods before the first token


@pytest.fixture(scope="module")
def slow_gateway(tmp_path_factory, cache_dir, engine):
    tmp = tmp_path_factory.mktemp("keepalive")
    with GatewayServer(settings_for(tmp, cache_dir, keepalive_s=KEEPALIVE_S), backend=SlowerBackend(engine)) as server:
        yield server


def _session(gateway) -> dict:
    reply = httpx.post(gateway.url + "/v1/sessions", json={}, headers=gateway.control)
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_the_wire_carries_spaces_then_the_body_and_comments_then_the_stream(slow_gateway):
    session = _session(slow_gateway)
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    plain = httpx.post(slow_gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert plain.status_code == 200 and plain.content.startswith(b"   ")  # a few periods of silence
    assert plain.json()["choices"][0]["message"]["role"] == "assistant"
    streamed = httpx.post(
        slow_gateway.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=60
    )
    assert streamed.status_code == 200 and streamed.text.startswith("\n\n\n")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    captures = httpx.get(
        f"{slow_gateway.url}/v1/sessions/{session['session_id']}/captures", headers=slow_gateway.control
    ).json()["captures"]
    assert [c["status"] for c in captures] == ["OK", "OK"]


def test_openai_sdk_reads_a_padded_body_and_a_kept_alive_stream(slow_gateway):
    session = _session(slow_gateway)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"], max_retries=0)
    reply = client.chat.completions.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert chunks and chunks[-1].choices[0].finish_reason is not None
    responses = client.responses.create(model="tiny", max_output_tokens=3, input="hi")
    assert responses.status in ("completed", "incomplete") and responses.output  # incomplete: max_output_tokens
    client.close()


def test_anthropic_sdk_reads_a_padded_body_and_a_kept_alive_stream(slow_gateway):
    session = _session(slow_gateway)
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"], max_retries=0)
    reply = client.messages.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert reply.role == "assistant" and reply.usage.output_tokens > 0
    with client.messages.stream(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason is not None
    client.close()


def test_google_genai_sdk_reads_a_padded_body_and_a_kept_alive_stream(slow_gateway):
    session = _session(slow_gateway)
    client = genai.Client(
        api_key=session["api_key"], http_options=gtypes.HttpOptions(base_url=session["base_urls"]["gemini"])
    )
    config = gtypes.GenerateContentConfig(max_output_tokens=3)
    reply = client.models.generate_content(model="tiny", contents="hi", config=config)
    assert reply.candidates and reply.usage_metadata.candidates_token_count > 0
    chunks = list(client.models.generate_content_stream(model="tiny", contents="hi", config=config))
    assert chunks and chunks[-1].candidates[0].finish_reason is not None
    client.close()
