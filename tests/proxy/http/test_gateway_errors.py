"""Bad input and bad credentials get a 4xx in the caller's own protocol, never a 500."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.backends.local import LocalBackend
from tests.conftest import CONTROL
from tests.proxy.gateway_server import GatewayServer, settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": "ok"}]}

# protocol → (path, how the key travels, a valid body, how to read the error message)
PROTOCOLS = {
    "openai_chat": (
        "/v1/chat/completions",
        "bearer",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        lambda b: b["error"]["message"],
    ),
    "openai_responses": ("/v1/responses", "bearer", {"model": "tiny", "input": "hi"}, lambda b: b["error"]["message"]),
    "anthropic": (
        "/v1/messages",
        "x-api-key",
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        lambda b: b["error"]["message"],
    ),
    "gemini": (
        "/v1beta/models/tiny:generateContent",
        "x-goog-api-key",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        lambda b: b["error"]["message"],
    ),
}


def headers(kind: str, key: str | None) -> dict[str, str]:
    if key is None:
        return {}
    return {"Authorization": f"Bearer {key}"} if kind == "bearer" else {kind: key}


def post(gateway, protocol, key, body=None, raw: bytes | None = None, path=None):
    route, kind, valid, _ = PROTOCOLS[protocol]
    content = raw if raw is not None else httpx.Request("POST", "/", json=valid if body is None else body).content
    return httpx.post(
        gateway.url + (path or route),
        content=content,
        headers={**headers(kind, key), "content-type": "application/json"},
        timeout=30,
    )


def assert_error(reply, protocol, status, *needles):
    assert reply.status_code == status, reply.text
    message = PROTOCOLS[protocol][3](reply.json())
    for needle in needles:
        assert needle.lower() in message.lower(), message
    if protocol == "anthropic":
        assert reply.json()["type"] == "error"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_happy_path_works(gateway, protocol):
    session = gateway.session(SCRIPT)
    assert post(gateway, protocol, session["api_key"]).status_code == 200


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_credentials(gateway, protocol):
    assert_error(post(gateway, protocol, None), protocol, 401, "api key")
    assert_error(post(gateway, protocol, "sk-polar-not-a-session"), protocol, 401, "invalid api key")
    session = gateway.session(SCRIPT)
    httpx.post(f"{gateway.url}/v1/sessions/{session['session_id']}/close", headers=CONTROL).raise_for_status()
    assert_error(post(gateway, protocol, session["api_key"]), protocol, 403, "closed")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_malformed_and_oversize_bodies(gateway, protocol):
    key = gateway.session(SCRIPT)["api_key"]
    assert_error(post(gateway, protocol, key, raw=b'{"model": "tiny", '), protocol, 400, "not valid json")
    assert_error(post(gateway, protocol, key, raw=b"\xff\xfe"), protocol, 400, "not valid json")
    assert_error(post(gateway, protocol, key, body=[1, 2]), protocol, 400)
    big = b'{"pad": "' + b"x" * (33 * 1024 * 1024) + b'"}'
    assert_error(post(gateway, protocol, key, raw=big), protocol, 413, "limit")


WRONG_TYPES = {
    "openai_chat": ({"model": "tiny", "messages": "hi"}, "messages"),
    "openai_responses": ({"model": "tiny", "input": 42}, "input"),
    "anthropic": ({"model": "tiny", "max_tokens": "lots", "messages": []}, "max_tokens"),
    "gemini": ({"contents": {"parts": "hi"}}, "contents"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_types_name_the_field(gateway, protocol):
    key = gateway.session(SCRIPT)["api_key"]
    body, field = WRONG_TYPES[protocol]
    assert_error(post(gateway, protocol, key, body=body), protocol, 400, field)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_for_a_pinned_session(gateway, protocol):
    key = gateway.session(SCRIPT, models=["other-model"])["api_key"]
    assert_error(post(gateway, protocol, key), protocol, 404, "tiny")


def test_unknown_gemini_method_and_unknown_path(gateway):
    key = gateway.session(SCRIPT)["api_key"]
    assert_error(post(gateway, "gemini", key, path="/v1beta/models/tiny:embedContent"), "gemini", 404, "embedContent")
    reply = post(gateway, "openai_chat", key, path="/v2/completions")
    assert reply.status_code == 404 and "/v2/completions" in reply.json()["error"]["message"]


def test_sampling_parameters_out_of_range(gateway):
    key = gateway.session(SCRIPT)["api_key"]
    body = dict(PROTOCOLS["openai_chat"][2], temperature=-1)
    assert_error(post(gateway, "openai_chat", key, body=body), "openai_chat", 400, "temperature")


def test_context_overflow_maps_to_each_provider_shape(gateway):
    key = gateway.session(SCRIPT)["api_key"]
    huge = "word " * 6000
    chat = post(gateway, "openai_chat", key, body={"model": "tiny", "messages": [{"role": "user", "content": huge}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded"
    claude = post(
        gateway,
        "anthropic",
        key,
        body={"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": huge}]},
    )
    assert claude.status_code == 400 and claude.json()["error"]["message"].startswith("prompt is too long")
    gem = post(gateway, "gemini", key, body={"contents": [{"role": "user", "parts": [{"text": huge}]}]})
    assert gem.status_code == 400 and gem.json()["error"]["status"] == "INVALID_ARGUMENT"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def mutate(valid: dict, draw_key: str, value) -> dict:
    """Replace one top-level field (or add a junk one) of a valid body."""
    body = dict(valid)
    keys = list(body) + [draw_key]
    body[keys[hash(draw_key) % len(keys)]] = value
    return body


@pytest.mark.parametrize("protocol", PROTOCOLS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=json_values, key_name=st.text(max_size=6), whole=st.booleans())
def test_fuzzed_bodies_never_get_a_500(gateway, protocol, junk, key_name, whole):
    if not hasattr(test_fuzzed_bodies_never_get_a_500, "keys"):
        test_fuzzed_bodies_never_get_a_500.keys = {}
    keys = test_fuzzed_bodies_never_get_a_500.keys
    keys.setdefault(protocol, gateway.session({"type": "scripted", "replies": [], "then": "x"})["api_key"])
    body = junk if whole else mutate(PROTOCOLS[protocol][2], key_name, junk)
    reply = post(gateway, protocol, keys[protocol], body=body)
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert PROTOCOLS[protocol][3](reply.json())


def test_session_isolation(gateway):
    a, b = gateway.session(SCRIPT), gateway.session(SCRIPT)
    post(gateway, "openai_chat", a["api_key"]).raise_for_status()
    assert len(gateway.captures(a["session_id"], key=a["api_key"])) == 1
    for path in (f"/v1/sessions/{b['session_id']}/captures", f"/v1/sessions/{b['session_id']}"):
        reply = httpx.get(gateway.url + path, headers={"Authorization": f"Bearer {a['api_key']}"})
        assert reply.status_code == 403
    assert (
        httpx.post(
            gateway.url + f"/v1/sessions/{b['session_id']}/close", headers={"Authorization": f"Bearer {a['api_key']}"}
        ).status_code
        == 403
    )
    assert (
        httpx.post(
            gateway.url + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {a['api_key']}"}
        ).status_code
        == 403
    )
    assert gateway.captures(b["session_id"]) == []  # A's calls landed in A only


def test_bad_session_requests(gateway):
    reply = httpx.post(
        gateway.url + "/v1/sessions", json={"policy": {"type": "scripted", "replies": "no"}}, headers=CONTROL
    )
    assert reply.status_code == 400 and "policy" in reply.json()["error"]["message"]
    reply = httpx.post(gateway.url + "/v1/sessions", json={"colour": "red"}, headers=CONTROL)
    assert reply.status_code == 400 and "colour" in reply.json()["error"]["message"]
    assert httpx.get(gateway.url + "/v1/sessions/nope/captures", headers=CONTROL).status_code == 404


def test_control_token(tmp_path, cache_dir, engine):
    settings = settings_for(tmp_path, cache_dir, control_token="ctl-secret")
    with GatewayServer(settings, backend=LocalBackend(engine)) as gw:
        assert httpx.post(gw.url + "/v1/sessions", json={}).status_code == 401
        made = httpx.post(gw.url + "/v1/sessions", json={}, headers={"Authorization": "Bearer ctl-secret"})
        assert made.status_code == 201
        sid = made.json()["session_id"]
        assert httpx.get(f"{gw.url}/v1/sessions/{sid}/captures").status_code == 401
        assert (
            httpx.get(
                f"{gw.url}/v1/sessions/{sid}/captures", headers={"Authorization": "Bearer ctl-secret"}
            ).status_code
            == 200
        )


def test_protocol_odds_and_ends(gateway):
    assert httpx.head(gateway.url + "/").status_code == 200
    assert httpx.get(gateway.url + "/v1/models").json()["data"][0]["id"] == "tiny"
    key = gateway.session(SCRIPT)["api_key"]
    counted = httpx.post(
        gateway.url + "/v1/messages/count_tokens",
        headers={"x-api-key": key},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    # Codex tries a WebSocket first: it must be refused at once, without a 101.
    reply = httpx.get(
        gateway.url + "/v1/responses",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert reply.status_code != 101 and reply.status_code >= 400
