"""Weights go to every live registered gateway: replicas register themselves (``polar.proxy.registration``, the
hook ``polar gateway`` runs at start and stop), the control API pushes to each live one over HTTP, retries a
failed push, and reports a partial one (naming which gateways have the version) without registering it.
Real gateways on loopback ports, each over its own copy of the tiny model, and a real SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import sqlalchemy as sa
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save

from db import gateways, make_engine, make_session_factory
from db.models import Gateway
from flows.dispatch import run_inline
from polar.api import create_api
from polar.backends.local import LocalBackend
from polar.clock import now
from polar.models.engine import LocalEngine
from polar.proxy.embedded import EmbeddedGateway
from polar.proxy.registration import registered, registry_id
from polar.rollout.context import store_factory
from tests.conftest import CONTROL
from tests.pg import migrated_store
from tests.rollout.helpers import test_settings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _upload(client: TestClient, version: str, engine: LocalEngine):
    noise = torch.Generator().manual_seed(len(version))
    tensors = {
        k: (v + 0.01 * torch.randn(v.shape, generator=noise)).contiguous() for k, v in engine.model.state_dict().items()
    }
    return client.post(
        "/v1/weights",
        params={"version": version},
        content=save(tensors),
        headers={**CONTROL, "content-type": "application/octet-stream"},
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_replicas_register_by_address_and_at_once(kind, tmp_path):
    """Hosts that share a hostname (network namespaces on one machine) are told apart by their addresses, and
    processes registering one id at the same moment (``--workers N``) all succeed."""
    first, second = registry_id("http://10.0.0.5:8700"), registry_id("http://10.0.0.6:8700")
    assert first == "10.0.0.5:8700" and first != second
    assert len(registry_id("http://" + "h" * 80 + ":8700")) <= 64
    with migrated_store(kind, tmp_path) as url:
        engine = make_engine(url)
        factory = make_session_factory(engine)
        try:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda _: gateways.register(factory, first, "http://10.0.0.5:8700", now()), range(8)))
            gateways.register(factory, second, "http://10.0.0.6:8700", now())
            assert sorted(gid for gid, _ in gateways.live(factory, now(), 30)) == [first, second]
        finally:
            engine.dispose()


async def test_weights_reach_every_live_gateway_and_a_partial_push_is_reported(
    tmp_path, cache_dir, tiny_model_dir, small_tokenizer
):
    engines = [LocalEngine(tiny_model_dir, small_tokenizer) for _ in range(2)]
    with contextlib.ExitStack() as stack, migrated_store("sqlite", tmp_path) as url:
        settings = test_settings(
            tmp_path, cache_dir, url, task_dispatch="inline", gateway_heartbeat_s=0.2, gateway_stale_s=5
        )
        factory = store_factory(settings)
        replicas = []
        for index, engine in enumerate(engines):
            stack.callback(engine.close)
            gateway = EmbeddedGateway(
                test_settings(tmp_path / f"gw{index}", cache_dir, url), backend=LocalBackend(engine)
            ).start()
            stack.callback(gateway.stop)
            replicas.append(gateway)
        async with contextlib.AsyncExitStack() as hooks:
            for gateway in replicas:
                await hooks.enter_async_context(
                    registered(
                        factory,
                        settings.model_copy(update={"gateway_advertise_url": gateway.url}),
                        gateway.host,
                        gateway.port,
                    )
                )
            # A replica that died without deregistering (silent): not a target. Heartbeats keep the others live.
            gateways.register(factory, "dead-host:8700", "http://127.0.0.1:1", now() - timedelta(minutes=5))
            await asyncio.sleep(0.5)
            with TestClient(create_api(settings, factory, run_inline=run_inline)) as client:
                reply = await asyncio.to_thread(_upload, client, "fleet-1", engines[0])
                assert reply.status_code == 201, reply.text
                body = reply.json()
                assert sorted(body["targets"]) == sorted(g.url for g in replicas)
                assert [p["error"] for p in body["pushes"]] == [None, None]
                assert [e.weight_version for e in engines] == ["fleet-1", "fleet-1"]

                # A live registered gateway that cannot be reached: retried, then reported, nothing registered.
                down = f"http://127.0.0.1:{_closed_port()}"
                gateways.register(factory, "unreachable:1", down, now())
                reply = await asyncio.to_thread(_upload, client, "fleet-2", engines[0])
                assert reply.status_code == 502, reply.text
                error = reply.json()["error"]
                assert error["type"] == "partial_weight_push"
                assert "reached 2 of 3" in error["message"] and f"{down} (3 attempts" in error["message"]
                assert client.get("/v1/weights", headers=CONTROL).json()["current"] == "fleet-1"
                # Once it is stopped (deregistered), publishing the version again reaches every live gateway.
                gateways.deregister(factory, "unreachable:1", now())
                reply = await asyncio.to_thread(_upload, client, "fleet-2", engines[0])
                assert (
                    reply.status_code == 201
                    and client.get("/v1/weights", headers=CONTROL).json()["current"] == "fleet-2"
                )
        # The hook marks a stopping replica stopped: no live gateway is left.
        with factory() as db:
            rows = {row.id: row for row in db.scalars(sa.select(Gateway))}
        assert gateways.live(factory, now(), settings.gateway_stale_s) == []
        assert all(rows[registry_id(g.url)].stopped_at is not None for g in replicas)
