"""Load per inference server URL: a real gateway process (``polar gateway``) over a fleet of two SGLang-shaped
servers (``polar serve-model``'s app on loopback, the tiny model), each server holding its ``/generate`` calls
until the test lets them go. With one in-flight slot per server and two sessions routed to each, the gateway's
``/metrics`` has one call in flight and one queued per server URL, and the live view shows them per URL: the
``/ui/live`` page's gateway row and ``polar status``'s text. Once released, every call is answered."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.backends.fleet import FleetBackend, Member
from polar.live.scrape import parse
from polar.live.text import format_live
from polar.live.view import LiveView
from polar.models.engine import LocalEngine
from polar.rollout.context import store_factory
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import test_settings
from tests.ui.browser import chromium_path
from tests.ui.conftest import screenshot
from tests.ui.live_fleet import STALE_S, fleet_env, start_gateways

TOKEN = os.environ["POLAR_CONTROL_TOKEN"]
CONTROL = {"Authorization": f"Bearer {TOKEN}"}


class Held:
    """An ASGI app that holds each ``POST /generate`` until ``release`` is set, then passes it on."""

    def __init__(self, app, release: threading.Event):
        self.app = app
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/generate":
            await asyncio.to_thread(self.release.wait, 60)
        await self.app(scope, receive, send)


@pytest.fixture
def servers(tiny_model_dir: Path, small_tokenizer) -> Iterator[tuple[list[str], threading.Event]]:
    release = threading.Event()
    engines = [LocalEngine(tiny_model_dir, small_tokenizer) for _ in range(2)]
    threads = [ServerThread(Held(create_app(e, served_model_name="tiny"), release)).start() for e in engines]
    try:
        yield [t.url for t in threads], release
    finally:
        release.set()
        for thread in threads:
            thread.stop()
        for engine in engines:
            engine.close()


def sessions_per_server(gateway_url: str, urls: list[str], each: int) -> dict[str, list[str]]:
    """Open sessions until ``each`` route to every server (the fleet's rendezvous ranking, as the gateway ranks)."""
    ranking = FleetBackend([Member(u) for u in urls], connect=None)  # type: ignore[arg-type]  # ranks only
    chosen: dict[str, list[str]] = {u: [] for u in urls}
    for _ in range(64):
        if all(len(keys) >= each for keys in chosen.values()):
            break
        reply = httpx.post(gateway_url + "/v1/sessions", json={}, headers=CONTROL, timeout=10)
        reply.raise_for_status()
        server = ranking.server_for(reply.json()["session_id"])
        if len(chosen[server]) < each:
            chosen[server].append(reply.json()["api_key"])
    assert all(len(keys) == each for keys in chosen.values()), chosen
    return chosen


def test_calls_in_flight_and_queued_show_per_inference_server(tmp_path, cache_dir, servers):
    urls, release = servers
    db_url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(db_url)
    env = fleet_env(tmp_path / "fleet", cache_dir, db_url) | {
        "POLAR_BACKEND": "sglang",
        "POLAR_BACKEND_URL": ",".join(urls),
        "POLAR_BACKEND_MAX_IN_FLIGHT": "1",
    }
    (gateway,) = start_gateways(1, env, tmp_path)
    try:
        keys = sessions_per_server(gateway.url, urls, each=2)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        with ThreadPoolExecutor(4) as pool:
            calls = [
                pool.submit(
                    httpx.post,
                    gateway.url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                )
                for server_keys in keys.values()
                for key in server_keys
            ]
            want = {u: 1.0 for u in urls}
            deadline, seen = time.monotonic() + 30, None
            while time.monotonic() < deadline:
                text = httpx.get(gateway.url + "/metrics", headers=CONTROL, timeout=5).text
                _, in_flight, queued = parse(text, 0.0)
                seen = (in_flight, queued)
                if in_flight == want and queued == want:
                    break
                time.sleep(0.05)
            assert seen == (want, want), seen
            settings = test_settings(tmp_path / "api", cache_dir, db_url, control_token=TOKEN, gateway_stale_s=STALE_S)
            snap = asyncio.run(LiveView(settings, store_factory(settings), TOKEN).snapshot())
            (view,) = snap.gateways
            assert view.load is not None and view.load.in_flight == want and view.load.queued == want
            status = format_live(snap)
            a, b = sorted(urls)
            assert f"in-flight {a}=1,{b}=1  queued {a}=1,{b}=1" in status, status
            app = create_api(settings, store_factory(settings), run_inline=run_inline)
            with ServerThread(app) as api, httpx.Client(follow_redirects=True, timeout=30) as browser:
                page = browser.get(f"{api.url}/ui/live?token={TOKEN}&fragment=fleet")
                assert page.status_code == 200
                row = page.text.split(f'data-gateway="{gateway.registry_id}"', 1)[1].split("</tr>", 1)[0]
                for url in urls:
                    assert f'<li data-server="{url}" data-in-flight="1" data-queued="1">' in row, row
                if chromium_path():
                    in_chromium(api.url, gateway.registry_id, urls)
            release.set()
            replies = [call.result(timeout=60) for call in calls]
        assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    finally:
        release.set()
        if gateway.proc.poll() is None:
            gateway.proc.terminate()
            gateway.proc.wait(timeout=30)


def in_chromium(api_url: str, gateway_id: str, urls: list[str]) -> None:
    """The page itself in Debian's Chromium: the gateway's row names both servers, one in flight and one queued."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 700})
        page.goto(f"{api_url}/ui/live?token={TOKEN}")
        shown = page.evaluate(
            """(id) => [...document.querySelectorAll(`tr.gateway[data-gateway="${id}"] li[data-server]`)]
                 .map(li => [li.dataset.server, li.dataset.inFlight, li.dataset.queued, li.innerText])""",
            gateway_id,
        )
        assert sorted(shown) == [[u, "1", "1", f"{u} 1 / 1"] for u in sorted(urls)], shown
        screenshot(page.locator("main"), "ui-live-servers")
        browser.close()
