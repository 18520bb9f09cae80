"""``/ui/live`` in a real headless Chromium during a running batch: two registered gateway processes, one killed
with SIGKILL mid-run shows DOWN within its heartbeat window (and raises the gateway_silent alarm, counted in the
control API's ``/metrics``), the other stays UP with its load scraped; every stage's occupancy read from the page
as it refreshes itself is within its limit. ``polar status`` prints the same summary, and redraws it with
``--watch``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import REGISTRY

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout import RolloutContext, drive_rollouts, process_limiter, submit_tasks
from polar.rollout.context import store_factory
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import answer_task, script, test_settings
from tests.ui.browser import require_chromium
from tests.ui.conftest import screenshot
from tests.ui.live_fleet import STALE_S, fleet_env, start_gateways

TOKEN = os.environ["POLAR_CONTROL_TOKEN"]  # the gateway processes enforce it; the UI is opened with it
LIMITS = {"init_concurrency": 2, "run_concurrency": 2, "postrun_concurrency": 1, "ready_buffer": 3}
REFRESH_S = 2.0
SLOW = script("sleep 1.5", "echo polar > answer.txt")

STATE = """() => ({
  gateways: Object.fromEntries([...document.querySelectorAll('tr.gateway')]
                               .map(r => [r.dataset.gateway, r.dataset.state])),
  stages: [...document.querySelectorAll('tr.occupancy')].map(r => [r.dataset.stage, Number(r.dataset.occupied),
           r.dataset.limit === '' ? null : Number(r.dataset.limit)]),
  alarms: [...document.querySelectorAll('li.alarm')].map(a => a.dataset.kind + ' ' + a.dataset.scope),
  collecting: Number(document.querySelector('#weights .collecting').dataset.n),
})"""


def counted_silent() -> float:
    return REGISTRY.get_sample_value("polar_alarms_total", {"kind": "gateway_silent"}) or 0.0


def test_the_live_page_during_a_batch_with_a_gateway_killed_mid_run(tmp_path, cache_dir, tiny_model_dir):
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    env = fleet_env(tmp_path / "fleet", cache_dir, url)
    survivor, doomed = start_gateways(2, env, tmp_path)
    settings = test_settings(tmp_path / "api", cache_dir, url, control_token=TOKEN, gateway_stale_s=STALE_S, **LIMITS)
    context = RolloutContext.create(settings, gateway_url=survivor.url)
    silent_before = counted_silent()
    try:
        tasks = [answer_task(name=f"live-{i}", samples=2, policies=[SLOW, SLOW]) for i in range(4)]
        ids = [rid for t in submit_tasks(context.factory, tasks) for rid in t.rollout_ids]

        async def batch() -> None:
            await drive_rollouts(context, ids, "live-test", limiter=process_limiter(settings))

        app = create_api(settings, store_factory(settings), run_inline=run_inline)
        with ThreadPoolExecutor(1) as pool, ServerThread(app) as api, sync_playwright() as p:
            assert httpx.get(api.url + "/ui/live").status_code == 401  # the UI's guard covers it
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{api.url}/ui/live?token={TOKEN}")
            first = page.evaluate(STATE)
            assert first["gateways"] == {survivor.registry_id: "UP", doomed.registry_id: "UP"}
            running = pool.submit(asyncio.run, batch())
            samples, killed_at, down_after = [], None, None
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                state = page.evaluate(STATE)
                samples.append(state)
                for stage, occupied, limit in state["stages"]:
                    assert limit is None or occupied <= limit, (stage, occupied, limit)
                run = dict((s, n) for s, n, _ in state["stages"])["run"]
                if killed_at is None and run > 0:
                    doomed.kill()  # mid-run: rollouts are in their run stage now
                    killed_at = time.monotonic()
                if killed_at is not None and down_after is None and state["gateways"][doomed.registry_id] == "DOWN":
                    down_after = time.monotonic() - killed_at
                    assert not running.done()  # still during the batch
                    screenshot(page.locator("main"), "ui-live")
                if down_after is not None and running.done():
                    break
                time.sleep(0.25)
            running.result()
            assert killed_at is not None and down_after is not None
            # Silent past the stale window, seen at the page's next refresh: within the window and one refresh.
            assert STALE_S - 0.5 <= down_after <= STALE_S + REFRESH_S + 1.5, down_after
            final = page.evaluate(STATE)
            assert final["gateways"] == {survivor.registry_id: "UP", doomed.registry_id: "DOWN"}
            assert f"gateway_silent gateway {doomed.registry_id}" in final["alarms"]
            assert counted_silent() - silent_before == 1  # once, however many refreshes showed it
            assert max(dict((s, n) for s, n, _ in st["stages"])["run"] for st in samples) >= 1
            assert max(st["collecting"] for st in samples) >= 1  # rollouts under way that have sampled
            page.wait_for_function("Number(document.querySelector('#throughput .finished').dataset.n) === 8")
            row = page.locator(f'tr.gateway[data-gateway="{survivor.registry_id}"]')
            assert "no answer" not in row.inner_text()  # its load was scraped from its /metrics
            browser.close()
        env |= {f"POLAR_{name.upper()}": str(size) for name, size in LIMITS.items()}
        status = subprocess.run(
            [sys.executable, "-m", "polar.cli", "status"], env=env, capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0, status.stderr
        out = status.stdout
        assert "8 rollouts: COMPLETED 8" in out  # the table it always printed, then the live summary
        assert f"UP       {survivor.registry_id}" in out and f"DOWN     {doomed.registry_id}" in out
        assert "stages:   pending 0  ready 0/3  init 0/2  run 0/2  postrun 0/1  evaluate 0/-" in out
        assert "8 finished" in out and f"gateway_silent: gateway {doomed.registry_id}" in out
        screens = tmp_path / "watch.txt"
        with screens.open("w") as sink:
            watch = subprocess.Popen(
                [sys.executable, "-m", "polar.cli", "status", "--watch", "0.5"], env=env, stdout=sink, text=True
            )
        give_up = time.monotonic() + 90
        while screens.read_text().count("stages:") < 2 and watch.poll() is None and time.monotonic() < give_up:
            time.sleep(0.2)
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=30)
        watched = screens.read_text()
        assert watched.count("\x1b[H\x1b[2J") >= 2 and watched.count("stages:") >= 2
    finally:
        context.close()
        for gateway in (survivor, doomed):
            if gateway.proc.poll() is None:
                gateway.proc.terminate()
                gateway.proc.wait(timeout=30)


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
