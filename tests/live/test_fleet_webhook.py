"""A fleet alarm (a gateway silent past its heartbeat: no batch, no task) goes to ``POLAR_FLEET_WEBHOOK_URL``
once per silence from the live view that sees it, however often it refreshes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastapi import FastAPI, Request

from db import gateways
from db.engine import make_engine, make_session_factory
from db.migrate import upgrade
from polar.clock import now
from polar.live.view import LiveView
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import test_settings


def test_a_silent_gateway_is_posted_once_to_the_fleet_webhook(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    factory = make_session_factory(make_engine(url))
    gateways.register(factory, "10.0.0.9:8000", "http://10.0.0.9:8000", now() - timedelta(seconds=60))
    received: list[tuple[str | None, dict]] = []
    hook = FastAPI()

    @hook.post("/fleet")
    async def fleet(request: Request) -> dict:
        received.append((request.headers.get("x-polar-event"), await request.json()))
        return {}

    with ServerThread(hook) as server:
        settings = test_settings(
            tmp_path / "api", cache_dir, url, gateway_stale_s=3.0, fleet_webhook_url=f"{server.url}/fleet"
        )
        view = LiveView(settings, factory, None)
        for _ in range(3):  # three refreshes, one silence
            snap = asyncio.run(view.snapshot())
            assert [a.kind.value for a in snap.alarms] == ["gateway_silent"]
    assert len(received) == 1
    event, body = received[0]
    assert event == "fleet_alarm" and body["event"] == "fleet_alarm"
    assert body["kind"] == "gateway_silent" and body["scope"] == "gateway 10.0.0.9:8000"
