"""``/ui/live`` without a browser: behind the UI's guard, its two fragments (fleet and curves), a registered
gateway that stopped beating shown DOWN with its alarm, and one that answers nothing but beats shown DRAINING."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient

from db import gateways
from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.clock import now
from polar.rollout.context import store_factory
from tests.live.seed import seed_rising
from tests.proxy.gateway_server import free_port
from tests.rollout.helpers import test_settings
from tests.ui.conftest import TOKEN

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def test_live_fragments_and_gateway_states(tmp_path, cache_dir):
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token=TOKEN, gateway_stale_s=5)
    factory = store_factory(settings)
    seed_rising(factory)
    gateways.register(factory, "gone:8700", "http://127.0.0.1:1", now() - timedelta(seconds=60))
    gateways.register(factory, f"127.0.0.1:{free_port()}", "http://127.0.0.1:9", now())  # beats, answers nothing
    with TestClient(create_api(settings, factory, run_inline=run_inline)) as client:
        assert client.get("/ui/live").status_code == 401
        page = client.get("/ui/live", headers=BEARER)
        assert page.status_code == 200 and page.text.count("<svg") == 4 and 'href="/ui/live"' in page.text
        fleet = client.get("/ui/live?fragment=fleet", headers=BEARER).text
        assert "<svg" not in fleet and "<html" not in fleet
        assert 'data-gateway="gone:8700" data-state="DOWN"' in fleet
        assert 'data-state="DRAINING"' in fleet
        assert 'data-kind="gateway_silent" data-scope="gateway gone:8700"' in fleet
        assert 'data-stage="run" data-occupied="0" data-limit="8"' in fleet
        curves = client.get("/ui/live?fragment=curves", headers=BEARER).text
        assert curves.count("<svg") == 4 and "5 weight versions" in curves and "<html" not in curves
