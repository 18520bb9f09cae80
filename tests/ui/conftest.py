"""UI-test fixtures: three real rollouts (two samples of one task, one solved
and one failed, and a harness that crashes: the built-in agent on scripted replies through a live gateway on the
local model), the control API with a control token serving ``/ui`` on a
loopback port, and a headless Debian chromium driven by Playwright (skipped when chromium is absent, except
under ``CI=true``). ``POLAR_UI_SCREENSHOTS=DIR`` makes the tests save their screenshots there."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.dispatch import run_inline
from polar.api import create_api
from polar.rollout import drive_rollouts, process_limiter, submit_tasks
from polar.rollout.context import store_factory
from polar.serving.threaded import ServerThread
from tests.rollout.conftest import context, sqlite_gateway, sqlite_url  # noqa: F401
from tests.rollout.helpers import answer_task, script, test_settings
from tests.ui.browser import require_chromium

TOKEN = "ui-s3cret"


@dataclass(frozen=True)
class UIStore:
    url: str  # the UI server's base URL
    task_id: str
    solved: str  # rollout ids: reward 1, reward 0, a harness that crashed (ERROR)
    failed: str
    crashed: str


@pytest.fixture(scope="module")
def ui_store(tmp_path_factory, cache_dir, sqlite_url, context) -> Iterator[UIStore]:
    task = answer_task(name="write-answer", samples=2, metadata={"group": "ui-demo"})
    crash = answer_task(name="crash", samples=1, policies=[script("echo started > log.txt", "kill -9 $PPID")])
    submitted, crashing = submit_tasks(context.factory, [task, crash])
    ids = [*submitted.rollout_ids, *crashing.rollout_ids]
    run = drive_rollouts(context, ids, "ui-test", limiter=process_limiter(context.settings))
    with ThreadPoolExecutor(1) as pool:  # its own loop: a fixture may be set up inside pytest-asyncio's
        pool.submit(asyncio.run, run).result()
    settings = test_settings(tmp_path_factory.mktemp("ui"), cache_dir, sqlite_url, control_token=TOKEN)
    app = create_api(settings, store_factory(settings), run_inline=run_inline)  # no lifespan: the UI only reads
    with ServerThread(app) as server:
        yield UIStore(server.url, submitted.task_id, solved=ids[0], failed=ids[1], crashed=ids[2])


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, ui_store):
    """A fresh browser context that has opened the UI once with ``?token=`` (so it holds the cookie)."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    tab = context.new_page()
    tab.goto(f"{ui_store.url}/ui/rollouts?token={TOKEN}")
    yield tab
    context.close()


def screenshot(target, name: str, **options) -> None:
    """Save ``target``'s screenshot as DIR/name.png when POLAR_UI_SCREENSHOTS=DIR is set."""
    folder = os.environ.get("POLAR_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        target.screenshot(path=str(Path(folder) / f"{name}.png"), **options)
