"""The learning curves on ``/ui/live`` in a real headless Chromium, on a store seeded as a GRPO run leaves it
(``tests.live.seed``: rewards rising with the weight version): four server-drawn SVG charts, the mean reward
of every group rising version after version, nothing loaded from elsewhere."""

from __future__ import annotations

from db.migrate import upgrade
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from polar.serving.threaded import ServerThread
from tests.live.seed import VERSIONS, seed_rising
from tests.rollout.helpers import test_settings
from tests.ui.browser import require_chromium
from tests.ui.conftest import TOKEN, screenshot

POINTS = """(metric) => Object.fromEntries(['all', 'arith', 'files'].map(series => [series,
  [...document.querySelectorAll(`figure[data-metric="${metric}"] circle[data-series="${series}"]`)]
    .map(c => [c.dataset.x, Number(c.dataset.y)])]))"""


def test_the_curves_show_reward_rising_by_version(tmp_path, cache_dir):
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    url = f"sqlite:///{tmp_path / 'polar.db'}"
    upgrade(url)
    settings = test_settings(tmp_path, cache_dir, url, control_token=TOKEN)
    expected = seed_rising(store_factory(settings))
    app = create_api(settings, store_factory(settings), run_inline=run_inline)
    with ServerThread(app) as api, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        outside: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(api.url) else None)
        page.goto(f"{api.url}/ui/live?token={TOKEN}")
        figures = page.locator("#curves figure.curve")
        metrics = [figures.nth(i).get_attribute("data-metric") for i in range(figures.count())]
        assert metrics == ["mean_reward", "solve_rate", "trainable_tokens", "duration_s"]
        rewards = page.evaluate(POINTS, "mean_reward")
        for series, points in rewards.items():
            assert [x for x, _ in points] == VERSIONS
            assert [y for _, y in points] == expected[series]
            assert all(b > a for (_, a), (_, b) in zip(points, points[1:], strict=False)), (series, points)
        assert page.locator('figure[data-metric="mean_reward"] polyline[data-series="all"]').count() == 1
        hover = page.locator('figure[data-metric="mean_reward"] circle[data-series="all"] title').last
        assert hover.text_content() == f"all · {VERSIONS[-1]}: {expected['all'][-1]:.4g}"
        assert outside == []
        screenshot(page.locator("#curves"), "ui-curves")
        browser.close()
