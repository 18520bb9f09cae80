"""The control API while its store is down: every route that reads or writes it answers 503 ``store_unavailable``
with a ``Retry-After``, so clients back off instead of retrying in a tight loop; the failure is counted."""

from __future__ import annotations

import socket

from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

from db.engine import make_engine
from flows.dispatch import run_inline
from polar import metrics
from polar.api import create_api
from tests.rollout.helpers import test_settings


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def test_a_store_outage_is_a_retryable_503(tmp_path, cache_dir):
    # the store went away after start (migrating needs it up, so the factory is built without that step)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test"
    settings = test_settings(tmp_path, cache_dir, url, control_token="s3cret", task_dispatch="inline")
    client = TestClient(create_api(settings, sessionmaker(make_engine(url)), run_inline=run_inline))  # no lifespan
    good = {"Authorization": "Bearer s3cret"}
    before = metrics.STORE_ERRORS.labels("api")._value.get()
    for method, path in [("GET", "/v1/tasks"), ("GET", "/v1/trajectories"), ("POST", "/v1/claims")]:
        reply = client.request(method, path, headers=good, json={"trainer": "t"})
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "store_unavailable", (path, reply.text)
        assert reply.headers["Retry-After"] == "1", path
    assert metrics.STORE_ERRORS.labels("api")._value.get() == before + 3
    # a refusal that retrying cannot fix carries none
    assert "Retry-After" not in client.get("/v1/tasks").headers
