"""The gateway's access log (``POLAR_GATEWAY_ACCESS_LOG``): one line per model call, through the official SDKs,
with the numbers the store holds for that call (session, protocol, tokens), its status and outcome, and calls
refused before the model (a wrong key) logged with their HTTP status; JSON and text; nothing when off."""

from __future__ import annotations

import json
import logging

import anthropic
import httpx
import openai
import pytest
import sqlalchemy as sa

from db import make_engine, make_session_factory
from db.models import Capture
from polar.auth import redact_url
from polar.backends.local import LocalBackend
from polar.proxy.access_log import _Record, format_line
from polar.settings import AccessLog
from tests.proxy.gateway_server import GatewayServer, settings_for


class Lines(logging.Handler):
    """The messages of the records it receives (after the logger's own filters ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines():
    handler = Lines()
    logger = logging.getLogger("polar.access")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_json_lines_one_per_model_call_match_the_stored_captures(tmp_path, cache_dir, engine, access_lines):
    settings = settings_for(tmp_path, cache_dir, gateway_access_log="json")
    with GatewayServer(settings, backend=LocalBackend(engine)) as gw:
        session = httpx.post(gw.url + "/v1/sessions", json={}, headers=gw.control).json()
        key = session["api_key"]
        chat = openai.OpenAI(base_url=gw.url + "/v1", api_key=key)
        chat.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        list(
            chat.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
            )
        )
        claude = anthropic.Anthropic(base_url=gw.url, api_key=key)
        claude.messages.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hello"}])
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gw.url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})  # not a model call
    entries = [json.loads(line) for line in access_lines]
    assert [(e["route"], e["status"], e["outcome"]) for e in entries] == [
        ("/v1/chat/completions", 200, "ok"),
        ("/v1/chat/completions", 200, "ok"),
        ("/v1/messages", 200, "ok"),
        ("/v1/chat/completions", 401, "http_401"),
    ]
    engine_ = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine_)() as db:
            stored = db.execute(sa.select(Capture).order_by(Capture.seq)).scalars().all()
            expected = [(c.rollout_id, c.protocol, c.n_prompt, c.n_output) for c in stored]
    finally:
        engine_.dispose()
    logged = [(e["session"], e["protocol"], e["prompt_tokens"], e["output_tokens"]) for e in entries[:3]]
    assert logged == expected and [p for _, p, _, _ in logged] == ["openai_chat", "openai_chat", "anthropic_messages"]
    assert all(e["latency_ms"] > 0 and e["commit_wait_ms"] >= 0 for e in entries[:3])
    assert entries[3]["session"] is None and entries[3]["commit_wait_ms"] is None


def test_the_text_format_and_off(tmp_path, cache_dir, engine, access_lines):
    record = _Record(route="/v1/messages", session="r1", protocol="anthropic_messages", status=200, outcome="ok")
    record.prompt_tokens, record.output_tokens, record.latency_ms, record.commit_wait_ms = 12, 3, 40.5, 1.25
    assert format_line(record, AccessLog.TEXT) == (
        "session=r1 protocol=anthropic_messages route=/v1/messages status=200 outcome=ok prompt_tokens=12 "
        "output_tokens=3 latency_ms=40.5 commit_wait_ms=1.25"
    )
    with GatewayServer(settings_for(tmp_path, cache_dir), backend=LocalBackend(engine)) as gw:  # off: the default
        session = httpx.post(gw.url + "/v1/sessions", json={}, headers=gw.control).json()
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        key = {"Authorization": f"Bearer {session['api_key']}"}
        assert httpx.post(gw.url + "/v1/chat/completions", json=body, headers=key, timeout=60).status_code == 200
    assert access_lines == []


@pytest.mark.parametrize(
    "query", ["key", "%6Bey", "ke%79", "KEY", "Api_Key", "%61pi_key", "token", "%74oken", "%2574oken", "TOKEN"]
)
def test_every_spelling_of_a_secret_query_parameter_is_redacted(query):
    line = redact_url(f"POST /v1beta/models/tiny:generateContent?alt=sse&{query}=sk-polar-SECRET&keys=shown HTTP/1.1")
    assert "SECRET" not in line and f"{query}=REDACTED" in line and "alt=sse" in line and "keys=shown" in line


def test_the_gateway_takes_a_percent_encoded_key_and_its_access_line_hides_it(tmp_path, cache_dir, engine):
    """``?%6Bey=`` is ``?key=`` to the gateway (query names are percent-decoded before they are read), so the
    redaction decodes names too: what is accepted as a key is never logged; spellings that are not accepted
    (``?KEY=``) are refused and redacted all the same."""
    access = logging.getLogger("uvicorn.access")
    handler, level = Lines(), access.level  # uvicorn's access lines, after its logger's filters (the redaction)
    with GatewayServer(settings_for(tmp_path, cache_dir), backend=LocalBackend(engine)) as gw:
        key = httpx.post(gw.url + "/v1/sessions", json={}, headers=gw.control).json()["api_key"]
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}}
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        try:
            accepted = httpx.post(f"{gw.url}/v1beta/models/tiny:generateContent?%6Bey={key}", json=body, timeout=60)
            refused = httpx.post(f"{gw.url}/v1beta/models/tiny:generateContent?KEY={key}", json=body, timeout=60)
        finally:
            access.removeHandler(handler)
            access.setLevel(level)
    assert accepted.status_code == 200, accepted.text
    assert refused.status_code == 401
    assert len(handler.lines) == 2 and all(key not in line for line in handler.lines), handler.lines
    assert "%6Bey=REDACTED" in handler.lines[0] and "KEY=REDACTED" in handler.lines[1]
