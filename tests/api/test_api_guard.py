"""``polar serve`` checks the token before it reads a byte of a body, limits every body (chunked ones as they
arrive), and closes connections whose headers never finish: measured on a real server process, over sockets."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.api.served import AUTH, Served, closed_after, declared, status_of, upload

MIB = 1 << 20


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    home = tmp_path_factory.mktemp("guarded")
    settings = {"POLAR_MAX_BODY_BYTES": str(4 * MIB), "POLAR_HEADER_TIMEOUT_S": "1", "POLAR_API_POLL_S": "0.2"}
    with Served(home, f"sqlite:///{home / 'polar.db'}", **settings) as served:
        yield served


def test_an_unauthenticated_upload_is_refused_before_its_body_with_memory_flat(api):
    before = api.rss()
    reply, sent, seconds = upload(api.port, "/v1/tasks", {"Content-Type": "application/json"}, 100 * MIB)
    after = api.rss()
    print(
        f"401 after {sent / MIB:.0f} MiB sent, {seconds * 1e3:.0f} ms; RSS {before / MIB:.1f} -> {after / MIB:.1f} MiB"
    )
    assert status_of(reply) == 401 and b'"authentication_error"' in reply, reply[:300]
    assert sent < 100 * MIB and seconds < 5  # answered before the client finished sending
    assert after - before < 16 * MIB  # the body was never held


def test_an_authenticated_chunked_upload_past_the_limit_is_a_413_as_it_passes(api):
    before = api.rss()
    reply, sent, seconds = upload(api.port, "/v1/tasks", {**AUTH, "Content-Type": "application/json"}, 100 * MIB)
    after = api.rss()
    print(
        f"413 after {sent / MIB:.0f} MiB sent, {seconds * 1e3:.0f} ms; RSS {before / MIB:.1f} -> {after / MIB:.1f} MiB"
    )
    assert status_of(reply) == 413 and b'"request_too_large"' in reply and b'"field":"body"' in reply, reply[:300]
    assert sent < 100 * MIB and after - before < 16 * MIB
    # a declared length past the limit is refused from the header
    assert status_of(declared(api.port, "/v1/claims", AUTH, 5 * MIB)) == 413
    # a weights upload (safetensors bytes) has its own, larger limit
    tensors = {**AUTH, "Content-Type": "application/octet-stream"}
    reply, sent, _ = upload(api.port, "/v1/weights?version=v1", tensors, 6 * MIB)
    assert sent == 6 * MIB and status_of(reply) not in (401, 413), reply[:300]


def test_the_token_comes_before_parsing_and_open_routes_stay_open(api):
    malformed = httpx.post(api.url + "/v1/tasks", content=b"{not json", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 401
    assert malformed.json()["error"] == {
        "type": "authentication_error",
        "message": "this endpoint needs the control token as a Bearer token",
        "field": None,
    }
    wrong = httpx.post(api.url + "/v1/tasks", content=b"{not json", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(api.url + "/metrics").status_code == 401
    parsed = httpx.post(
        api.url + "/v1/tasks", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert parsed.status_code == 400  # with the token, the body is read and its error is the caller's 400
    within = httpx.post(api.url + "/v1/tasks", json={"tasks": []}, headers=AUTH)
    assert within.status_code in (201, 400), within.text  # under the limit the route itself answers
    health = httpx.get(api.url + "/health")
    assert health.status_code == 200 and health.json()["store"] == "ok"
    # the web UI without the token answers its own 401 page, and is never handed the body
    page = httpx.request("GET", api.url + "/ui/rollouts", content=b"x" * MIB)
    assert page.status_code == 401 and "text/html" in page.headers["content-type"]


def test_unfinished_headers_are_closed_after_the_header_timeout(api):
    silent = closed_after(api.port, b"", 10)
    partial = closed_after(api.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", 10)
    # the next request on a kept-alive connection (here pipelined) gets the same deadline from its first byte
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    second = closed_after(api.port, request + b"GET /health HTTP/1.1\r\nHo", 10)
    print(f"closed after {silent} s (nothing sent), {partial} s (half a header), {second} s (half a second request)")
    assert silent is not None and 0.8 < silent < 4
    assert partial is not None and 0.8 < partial < 4
    assert second is not None and 0.8 < second < 4  # uvicorn's keep-alive (5 s here) would have been later
    with httpx.Client() as client:
        started = time.monotonic()
        for _ in range(3):  # a normal client is never cut off, even across the timeout
            assert client.get(api.url + "/health").status_code == 200
            time.sleep(0.6)
        assert time.monotonic() - started > 1.5
