"""Closed by default: with no POLAR_CONTROL_TOKEN the gateway generates one in $POLAR_HOME/control-token (0600);
every control route is a 401 without it, the file's token opens them, session keys stay in their own session,
and ``?key=`` is a session key only on the Gemini paths (and never reaches the access log)."""

from __future__ import annotations

import logging
import stat

import httpx
import pytest

from polar.auth import TOKEN_FILE, RedactQueryKeys, control_token
from polar.backends.local import LocalBackend
from tests.app_routes import every_route
from tests.proxy.gateway_server import GatewayServer, settings_for

# Paths as tests.app_routes.every_route names them (each path parameter "x").
MODEL_ROUTES = {
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1beta/models/x",
}
PUBLIC = {"/", "/health", "/health/live", "/health/ready", "/v1/models"}  # probes and the model list stay open
# A WebSocket upgrade there is refused at once, for anyone (tests/proxy/http/test_ws_denial.py).
WS_REFUSAL = ("GET", "/v1/responses")
SCHEMA = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}  # the API schema and its viewers: no data
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest.fixture(scope="module")
def closed(tmp_path_factory, cache_dir, engine):
    tmp = tmp_path_factory.mktemp("closed")
    settings = settings_for(tmp, cache_dir, control_token="")  # the default: no token configured
    with GatewayServer(settings, backend=LocalBackend(engine)) as server:
        yield server, tmp


def guarded_routes(server: GatewayServer) -> list[tuple[str, str]]:
    """Every route of the gateway but the probes and the schema, read from its own router."""
    app = server._server.config.app  # type: ignore[union-attr]
    return [(m, p) for m, p in every_route(app) if p not in PUBLIC | SCHEMA]


def control_routes(server: GatewayServer) -> list[tuple[str, str]]:
    return [(m, p) for m, p in guarded_routes(server) if p not in MODEL_ROUTES]


def test_every_route_but_the_probes_is_a_401_without_credentials(closed):
    """Read from the app's own router, so a new route is covered without being listed: every route but the probes
    and the schema refuses a caller without credentials, model routes before reading the body."""
    server, _ = closed
    routes = [route for route in guarded_routes(server) if route != WS_REFUSAL]
    assert {"/v1/chat/completions", "/v1/messages", "/v1/sessions", "/metrics"} <= {p for _, p in routes}
    for method, path in routes:
        path = path.replace("/v1beta/models/x", "/v1beta/models/x:generateContent")  # {model}:{method}
        reply = httpx.request(method, server.url + path, json=CHAT, timeout=10)
        assert reply.status_code == 401, (method, path, reply.text)


def test_a_token_file_is_generated_with_mode_0600(closed):
    _, home = closed
    path = home / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) > 30
    assert control_token(settings_for(home, home, control_token="")) == token  # every reader gets the same one


def test_every_control_route_is_a_401_without_the_token(closed):
    server, home = closed
    token = (home / TOKEN_FILE).read_text().strip()
    routes = control_routes(server)
    assert ("POST", "/v1/sessions") in routes and ("POST", "/v1/admin/weights") in routes and len(routes) >= 6
    wrong = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {token}x"},
        {"x-api-key": token},  # the control token only travels as a Bearer token
        {"x-goog-api-key": token},
    ]
    for method, path in routes:
        for headers in wrong:
            reply = httpx.request(method, server.url + path, headers=headers, json={}, timeout=10)
            assert reply.status_code == 401, (method, path, headers, reply.text)
            assert reply.json()["error"]["type"] == "authentication_error"
        reply = httpx.request(method, server.url + path, params={"key": token}, json={}, timeout=10)
        assert reply.status_code == 401, (method, path, "?key=")


def test_the_token_file_opens_the_control_routes(closed):
    server, home = closed
    good = {"Authorization": f"Bearer {(home / TOKEN_FILE).read_text().strip()}"}
    made = httpx.post(server.url + "/v1/sessions", json={}, headers=good, timeout=10)
    assert made.status_code == 201
    sid = made.json()["session_id"]
    assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=good).status_code == 200
    assert httpx.get(f"{server.url}/v1/sessions/{sid}/captures", headers=good).json()["captures"] == []
    assert httpx.post(f"{server.url}/v1/sessions/{sid}/close", headers=good).status_code == 200


def test_session_keys_stay_in_their_session(closed):
    server, home = closed
    good = {"Authorization": f"Bearer {(home / TOKEN_FILE).read_text().strip()}"}
    a, b = (httpx.post(server.url + "/v1/sessions", json={}, headers=good).json() for _ in range(2))
    mine = {"Authorization": f"Bearer {a['api_key']}"}
    assert httpx.get(f"{server.url}/v1/sessions/{a['session_id']}/captures", headers=mine).status_code == 200
    assert httpx.get(f"{server.url}/v1/sessions/{a['session_id']}", headers={"x-api-key": a["api_key"]}).is_success
    for method, path in [
        ("GET", f"/v1/sessions/{b['session_id']}/captures"),
        ("GET", f"/v1/sessions/{b['session_id']}"),
        ("POST", f"/v1/sessions/{b['session_id']}/close"),
        ("POST", f"/v1/sessions/{a['session_id']}/close"),  # closing, even one's own, is the pipeline's job
        ("POST", "/v1/sessions"),
        ("POST", "/v1/admin/weights"),
    ]:
        reply = httpx.request(method, server.url + path, headers=mine, json={"version": "x"})
        assert reply.status_code == 403, (method, path, reply.text)
    assert httpx.get(f"{server.url}/v1/sessions/{b['session_id']}/captures", headers=good).json()["captures"] == []


def test_query_keys_only_on_gemini_paths(closed, caplog):
    server, home = closed
    good = {"Authorization": f"Bearer {(home / TOKEN_FILE).read_text().strip()}"}
    policy = {"type": "scripted", "replies": [{"content": "ok"}, {"content": "ok"}]}
    session = httpx.post(server.url + "/v1/sessions", json={"policy": policy}, headers=good).json()
    key = session["api_key"]
    openai = httpx.post(server.url + "/v1/chat/completions", params={"key": key}, json=CHAT, timeout=30)
    assert openai.status_code == 401 and openai.json()["error"]["type"] == "authentication_error"
    anthropic = httpx.post(server.url + "/v1/messages", params={"key": key}, json={**CHAT, "max_tokens": 4})
    assert anthropic.status_code == 401 and anthropic.json()["type"] == "error"
    gemini = httpx.post(
        server.url + "/v1beta/models/tiny:generateContent", params={"key": key}, json=GEMINI, timeout=30
    )
    assert gemini.status_code == 200, gemini.text


def test_the_access_log_never_shows_a_query_key():
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", "/v1beta/models/tiny:generateContent?alt=sse&key=sk-polar-SECRET", "1.1", 200),
        None,
    )
    assert RedactQueryKeys().filter(record)
    line = record.getMessage()
    assert "SECRET" not in line and "key=REDACTED" in line and "alt=sse" in line
    # the filter sits on uvicorn's access logger once a gateway app exists
    assert any(isinstance(f, RedactQueryKeys) for f in logging.getLogger("uvicorn.access").filters)
