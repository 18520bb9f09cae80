"""With POLAR_CONTROL_TOKEN set, every /v1 route of the control API needs it as a Bearer token; /health does not."""

from __future__ import annotations

import stat

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.auth import TOKEN_FILE
from polar.rollout.context import store_factory
from tests.app_routes import every_route
from tests.rollout.helpers import test_settings


def test_the_control_token_guards_every_v1_route(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token="s3cret", task_dispatch="inline")
    client = TestClient(
        create_api(settings, store_factory(settings), run_inline=run_inline)
    )  # no lifespan: nothing is dispatched
    assert client.get("/health").status_code == 200
    calls = [
        ("GET", "/v1/tasks"),
        ("GET", "/v1/trajectories"),
        ("GET", "/v1/weights"),
        ("POST", "/v1/claims"),
        ("POST", "/v1/tasks/x/cancel"),
        ("GET", "/v1/rollouts/x"),
    ]
    for method, path in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            reply = client.request(method, path, headers=headers, json={"trainer": "t"})
            assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error", (
                path,
                reply.text,
            )
    good = {"Authorization": "Bearer s3cret"}
    assert client.get("/v1/tasks", headers=good).json() == {"tasks": []}
    assert client.post("/v1/claims", headers=good, json={"trainer": "t"}).json()["claim_id"] is None
    assert client.get("/v1/rollouts/x", headers=good).status_code == 404
    assert (
        client.get("/openapi.json").status_code == 200 and "/v1/claims" in client.get("/openapi.json").json()["paths"]
    )


def test_closed_by_default_every_v1_route_needs_the_generated_token(tmp_path, cache_dir):
    """No POLAR_CONTROL_TOKEN: the API generates one in $POLAR_HOME/control-token and enforces it everywhere."""
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token="", task_dispatch="inline")
    app = create_api(settings, store_factory(settings), run_inline=run_inline)
    client = TestClient(app)
    token = (tmp_path / TOKEN_FILE).read_text().strip()
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600
    routes = [
        (method, route.path.replace("{task_id}", "x").replace("{rollout_id}", "x").replace("{claim_id}", "x"))
        for route in app.routes
        if isinstance(route, APIRoute) and route.path.startswith("/v1")
        for method in sorted(route.methods)
    ]
    assert len(routes) >= 12
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": token}):
            reply = client.request(method, path, headers=headers, json={"trainer": "t"})
            assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error", (path, headers)
        assert client.request(method, path, params={"key": token}, json={}).status_code == 401
    good = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/tasks", headers=good).json() == {"tasks": []}
    assert client.get("/v1/rollouts/x", headers=good).status_code == 404


# Open on purpose: the liveness probe, the schema and its viewers (no data), and the UI's CSS/JS.
PUBLIC = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/ui/static"}


def test_closed_by_default_every_route_of_the_app_and_the_ui_needs_the_token(tmp_path, cache_dir):
    """No POLAR_CONTROL_TOKEN: every route but the public ones, /ui pages and capture JSON included, refuses a
    caller without the generated token (401), and the token opens the UI."""
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token="", task_dispatch="inline")
    app = create_api(settings, store_factory(settings), run_inline=run_inline)
    client = TestClient(app, follow_redirects=False)
    token = (tmp_path / TOKEN_FILE).read_text().strip()
    routes = [(m, p) for m, p in every_route(app) if p not in PUBLIC]
    paths = {p for _, p in routes}
    assert {"/ui", "/ui/rollouts/x", "/ui/compare", "/ui/captures/x.json", "/metrics", "/v1/tasks"} <= paths
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Cookie": "polar_ui=nope"}):
            reply = client.request(method, path, headers=headers, params={"full": "1"}, json={})
            assert reply.status_code == 401, (method, path, headers, reply.status_code)
        assert client.request(method, path, params={"token": "nope"}).status_code == 401, (method, path)
    assert client.get("/ui", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    entered = client.get("/ui", params={"token": token})
    assert entered.status_code == 303 and "polar_ui" in entered.headers["set-cookie"]
    assert client.get("/ui/compare").status_code != 401  # the cookie now opens the UI
