"""The learning curves on ``/ui/live`` in a real headless Chromium after a real closed GRPO loop: ``python -m
examples.grpo`` (the control API on the embedded defaults, the tiny local model trained on the toy task through
rollouts, claims, updates and published weights), then the UI on the store it leaves: the mean reward drawn for
each weight version is that of the step's twelve samples (their evaluator's rewards, as stored), and it rises at
every version.

The loop is seeded (every sample's call, the trainer) and its update depends only on the sampled ids and rewards,
so it repeats itself run after run; nothing here knows the rewards in advance. About a minute and a half on two
cores, most of it Prefect's ephemeral server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from db.enums import RolloutStatus
from db.models import Rollout
from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout.context import store_factory
from polar.serving.threaded import ServerThread
from tests.rollout.helpers import test_settings
from tests.ui.browser import require_chromium
from tests.ui.conftest import TOKEN, screenshot

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
GROUPS, SAMPLES = 2, 6
LOOP = ["--steps", str(STEPS), "--groups", str(GROUPS), "--samples", str(SAMPLES), "--seed", "0"]
VERSIONS = [f"grpo-step-{i}" for i in range(STEPS)]  # the versions the samples were drawn from
RISE = 0.15  # the least first-to-last gain of the mean reward that counts as clearly learning

POINTS = """(metric) => {
  const points = {};
  for (const c of document.querySelectorAll(`figure[data-metric="${metric}"] circle`))
    (points[c.dataset.series] ??= []).push([c.dataset.x, Number(c.dataset.y)]);
  return points;
}"""  # series -> [(version, value)] in drawing order


def run_loop(home: Path, cache_dir: Path) -> str:
    """``python -m examples.grpo`` in a clean environment (no POLAR_ or PREFECT_ settings but the model cache);
    returns what it printed."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("POLAR_", "PREFECT_"))}
    env["POLAR_CACHE"] = str(cache_dir)
    argv = [sys.executable, "-m", "examples.grpo", *LOOP, "--home", str(home), "--plot", str(home / "reward.png")]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_a_real_grpo_loop_draws_the_reward_rising_by_version(tmp_path, cache_dir):
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    home = tmp_path / "home"
    printed = run_loop(home, cache_dir)
    settings = test_settings(tmp_path / "ui", cache_dir, f"sqlite:///{home / 'polar.db'}", control_token=TOKEN)
    with store_factory(settings)() as db:
        stored = db.execute(
            sa.select(Rollout.weight_version_max, sa.func.count(), sa.func.avg(Rollout.reward))
            .where(Rollout.status == RolloutStatus.COMPLETED)
            .group_by(Rollout.weight_version_max)
        ).all()
    by_version = {version: (n, mean) for version, n, mean in stored}
    assert sorted(by_version) == VERSIONS and {n for n, _ in by_version.values()} == {GROUPS * SAMPLES}, printed
    app = create_api(settings, store_factory(settings), run_inline=run_inline)  # no lifespan: the UI only reads
    with ServerThread(app) as api, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        outside: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(api.url) else None)
        page.goto(f"{api.url}/ui/live?token={TOKEN}")
        rewards = page.evaluate(POINTS, "mean_reward")
        assert sorted(rewards) == ["0", "1", "all"]  # the two task groups (metadata.group) and all
        for points in rewards.values():
            assert [x for x, _ in points] == VERSIONS
        drawn = [y for _, y in rewards["all"]]
        assert all(abs(y - by_version[v][1]) < 1e-5 for v, y in zip(VERSIONS, drawn, strict=True)), (drawn, stored)
        assert all(b > a for a, b in zip(drawn, drawn[1:], strict=False)), (drawn, printed)
        assert drawn[-1] - drawn[0] >= RISE, (drawn, printed)
        assert page.locator('figure[data-metric="mean_reward"] polyline[data-series="all"]').count() == 1
        assert outside == []
        screenshot(page.locator("#curves"), "ui-curves-grpo")
        browser.close()
