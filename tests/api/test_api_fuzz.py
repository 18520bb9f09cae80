"""Schema fuzzing of the control API: schemathesis generates requests from its OpenAPI spec (valid and
invalid ones), and no response may be a 5xx. The store is real (SQLite, and Postgres when configured) and so
is the gateway that weights are pushed to; the app runs without its background loop, so fuzzed tasks are
stored but never started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from tests.conftest import CONTROL
from tests.pg import STORES, migrated_store
from tests.rollout.helpers import test_settings


@pytest.fixture(scope="module", params=STORES)
def store_for_fuzz(request, tmp_path_factory) -> Iterator[str]:
    with migrated_store(request.param, tmp_path_factory.mktemp("fuzz")) as url:
        yield url


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory, cache_dir, api_gateway, store_for_fuzz) -> FastAPI:
    settings_ = test_settings(tmp_path_factory.mktemp("fuzz-home"), cache_dir, store_for_fuzz, task_dispatch="inline")
    return create_api(settings_, store_factory(settings_), gateway_url=api_gateway.url, run_inline=run_inline)


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


def operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_is_in_the_spec(fuzz_schema):
    paths = {(op.method.upper(), op.path) for op in operations(fuzz_schema)}
    assert {
        ("POST", "/v1/tasks"),
        ("POST", "/v1/claims"),
        ("POST", "/v1/weights"),
        ("GET", "/v1/trajectories"),
        ("GET", "/v1/model"),
        ("GET", "/metrics"),
        ("GET", "/v1/trajectories/{trajectory_id}/extras"),
    } <= paths
    assert len(paths) == 18


def test_no_request_gets_a_server_error(fuzz_schema):
    failures = []
    for operation in operations(fuzz_schema):

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case) -> None:
            response = case.call(headers=CONTROL)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query} -> {response.status_code} {response.text[:200]}"
                )

        fuzz()
    assert not failures, "\n".join(failures[:10])


def test_a_row_id_past_64_bits_is_a_400_naming_it(fuzz_app):
    """Found by the fuzzer: SQLite's driver overflowed on 2**63 and the route answered 500."""
    client = TestClient(fuzz_app)  # no lifespan: like the fuzzer, without the background loop
    for trajectory_id in (2**63, 0):
        response = client.get(f"/v1/trajectories/{trajectory_id}/extras", headers=CONTROL)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["field"] == "path.trajectory_id"


def test_an_import_path_with_a_nul_is_a_400_naming_it(fuzz_app):
    """Found by the fuzzer: the OS refused the path and the route answered 500."""
    client = TestClient(fuzz_app)
    response = client.post("/v1/tasks/import", json={"path": "tasks/\u0000x"}, headers=CONTROL)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == "path"
