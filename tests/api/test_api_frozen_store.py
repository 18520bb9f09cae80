"""``polar serve`` on a frozen Postgres (every server process SIGSTOPped): ``/v1`` and ``/ui`` answer a shaped 503
with ``Retry-After`` within ``POLAR_STORE_STATEMENT_TIMEOUT_S``, ``/health`` answers within
``POLAR_HEALTH_TIMEOUT_S``, and once the store is thawed everything works again."""

from __future__ import annotations

import time

import httpx

from tests.api.served import AUTH, Served
from tests.proxy.own_postgres import OwnPostgres, needs_own_postgres

BOUND_S = 2.0


def _timed(method: str, url: str, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    reply = httpx.request(method, url, timeout=60, **kwargs)
    return reply, time.monotonic() - started


@needs_own_postgres
def test_a_frozen_store_is_a_503_within_the_bound_and_health_answers(tmp_path):
    settings = {"POLAR_STORE_STATEMENT_TIMEOUT_S": str(BOUND_S), "POLAR_HEALTH_TIMEOUT_S": "1"}
    with OwnPostgres() as pg, Served(tmp_path, pg.url, **settings) as api:
        assert httpx.get(api.url + "/v1/tasks", headers=AUTH).status_code == 200
        pg.freeze()
        try:
            for method, path in [("GET", "/v1/tasks"), ("GET", "/v1/weights"), ("POST", "/v1/claims"), ("GET", "/ui")]:
                reply, seconds = _timed(method, api.url + path, headers=AUTH, json={"trainer": "t"})
                print(f"{method} {path}: {reply.status_code} in {seconds:.2f} s")
                assert reply.status_code == 503, (path, reply.text)
                assert reply.json()["error"]["type"] == "store_unavailable" and reply.headers["Retry-After"] == "1"
                assert seconds < BOUND_S + 1.5, path
            health, seconds = _timed("GET", api.url + "/health")
            print(f"/health: {health.status_code} in {seconds:.2f} s")
            assert health.status_code == 200 and health.json()["store"] == "unavailable" and seconds < 2.5
        finally:
            pg.thaw()
        deadline = time.monotonic() + 30
        while httpx.get(api.url + "/v1/tasks", headers=AUTH, timeout=60).status_code != 200:
            assert time.monotonic() < deadline, "the API did not recover after the store was thawed"
            time.sleep(0.5)
        assert httpx.get(api.url + "/health").json()["store"] == "ok"
        assert httpx.get(api.url + "/ui", headers=AUTH).status_code == 200
