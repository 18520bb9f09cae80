"""A real gateway process (``polar gateway``) sent SIGTERM while it holds a model call announces its drain: the
live view (the model behind ``/ui/live`` and ``polar status``) shows it DRAINING from its registry row while the
call finishes, the call still gets its answer, and once the process has exited the replica is gone (STOPPED)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from db.engine import make_engine, make_session_factory
from db.migrate import upgrade
from db.models import Gateway
from polar.live.fleet import GatewayState
from polar.live.text import format_live
from polar.live.view import LiveView
from tests.rollout.helpers import test_settings
from tests.ui.live_fleet import STALE_S, fleet_env, start_gateways

TOKEN = os.environ["POLAR_CONTROL_TOKEN"]
HOLD_S = 3.0  # the call's reply is held this long; uvicorn waits up to 5 s for it after SIGTERM


def states(view: LiveView) -> tuple[dict[str, GatewayState], str]:
    snap = asyncio.run(view.snapshot())
    return {g.entry.id: g.state for g in snap.gateways}, format_live(snap)


def test_a_gateway_sent_sigterm_mid_call_shows_draining_then_stopped(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    (gateway,) = start_gateways(1, fleet_env(tmp_path / "fleet", cache_dir, url), tmp_path)
    settings = test_settings(tmp_path / "api", cache_dir, url, control_token=TOKEN, gateway_stale_s=STALE_S)
    factory = make_session_factory(make_engine(url))
    view = LiveView(settings, factory, TOKEN)
    try:
        assert states(view)[0] == {gateway.registry_id: GatewayState.UP}
        control = {"Authorization": f"Bearer {TOKEN}"}
        policy = {"type": "scripted", "tool_free_reply": "held", "delay_s": HOLD_S}
        session = httpx.post(gateway.url + "/v1/sessions", json={"policy": policy}, headers=control, timeout=10)
        session.raise_for_status()
        key = session.json()["api_key"]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(
                httpx.post,
                gateway.url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            time.sleep(1.0)  # the call is inside the gateway, its reply held
            assert not call.done()
            gateway.proc.send_signal(signal.SIGTERM)
            seen: list[tuple[GatewayState, str]] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not call.done():
                state, text = states(view)
                seen.append((state[gateway.registry_id], text))
                if state[gateway.registry_id] is GatewayState.DRAINING:
                    break
                time.sleep(0.1)
            assert seen and seen[-1][0] is GatewayState.DRAINING, seen
            assert "DRAINING" in seen[-1][1]  # polar status prints it
            with factory() as db:
                row = db.get(Gateway, gateway.registry_id)
                assert row is not None and row.draining_at is not None and row.stopped_at is None
            reply = call.result(timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "held"
        gateway.proc.wait(timeout=30)
        assert states(view)[0] == {gateway.registry_id: GatewayState.STOPPED}
    finally:
        if gateway.proc.poll() is None:
            gateway.kill()
