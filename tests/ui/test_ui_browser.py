"""The web UI in a real headless Chromium: the list loads and filters, a rollout page shows its stages, its
capture tree and trajectories whose highlighted trainable tokens are exactly the stored loss mask, compare
shows both sides, an unknown id is a 404 page, and without the control token the UI refuses."""

from __future__ import annotations

import re

import httpx
import pytest

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Rollout, Task
from tests.rollout.helpers import captures, trajectories
from tests.ui.conftest import TOKEN, screenshot

# The crashed harness's kill -9, as the runtime reports it: -9 on the host, 137 (128 + 9) from bubblewrap's init.
KILLED = re.compile(r"exited with code (-9|137)\b")

pytestmark = pytest.mark.usefixtures("browser")


def test_without_the_control_token_the_ui_refuses(browser, ui_store):
    for path in ("/ui", "/ui/rollouts", f"/ui/rollouts/{ui_store.solved}", f"/ui/groups/{ui_store.task_id}"):
        assert httpx.get(ui_store.url + path).status_code == 401
    assert httpx.get(f"{ui_store.url}/ui/rollouts?token=wrong").status_code == 401
    assert httpx.get(f"{ui_store.url}/ui", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    context = browser.new_context()
    tab = context.new_page()
    reply = tab.goto(f"{ui_store.url}/ui/rollouts")
    assert reply.status == 401 and tab.locator("h1").inner_text() == "Control token needed"
    assert tab.locator("table.rollouts").count() == 0
    context.close()


def test_a_token_in_the_url_sets_an_httponly_cookie_and_leaves_the_url(page, ui_store):
    assert "token=" not in page.url and page.url.endswith("/ui/rollouts")
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "polar_ui"]
    assert cookie["httpOnly"] and cookie["path"] == "/ui" and cookie["value"] != TOKEN
    assert page.goto(f"{ui_store.url}/ui/rollouts/{ui_store.solved}").status == 200  # the cookie alone suffices


def test_the_rollout_list_loads_and_filters(page, ui_store):
    rows = page.locator("table.rollouts tbody tr[data-rollout]")
    shown = {rows.nth(i).get_attribute("data-rollout") for i in range(rows.count())}
    assert {ui_store.solved, ui_store.failed, ui_store.crashed} <= shown
    solved = page.locator(f'tr[data-rollout="{ui_store.solved}"]')
    assert solved.locator(".reward").inner_text() == "1.00" and "COMPLETED" in solved.inner_text()
    screenshot(page.locator("main"), "ui-rollouts")
    page.fill('input[name="min_reward"]', "1")
    page.click('button[type="submit"]')
    page.wait_for_url("**min_reward=1**")
    assert [rows.nth(i).get_attribute("data-rollout") for i in range(rows.count())] == [ui_store.solved]
    page.select_option('select[name="group"]', "ui-demo")
    page.fill('input[name="min_reward"]', "")
    page.fill('input[name="max_reward"]', "0.5")
    page.click('button[type="submit"]')
    page.wait_for_url("**max_reward=0.5**")
    assert [rows.nth(i).get_attribute("data-rollout") for i in range(rows.count())] == [ui_store.failed]
    page.select_option('select[name="status"]', "ERROR")
    page.click('button[type="submit"]')
    page.wait_for_url("**status=ERROR**")
    assert page.locator("td.empty").inner_text() == "No rollouts match."  # the group's samples both completed
    page.goto(f"{ui_store.url}/ui/rollouts?status=ERROR")
    (crashed,) = [rows.nth(i) for i in range(rows.count())]
    assert crashed.get_attribute("data-rollout") == ui_store.crashed and KILLED.search(crashed.inner_text())
    assert page.goto(f"{ui_store.url}/ui/rollouts?min_reward=lots").status == 400
    assert "min_reward must be a number" in page.locator(".message").inner_text()


def test_a_rollout_page_shows_stages_capture_tree_and_the_stored_loss_mask(page, ui_store, context):
    page.goto(f"{ui_store.url}/ui/rollouts/{ui_store.solved}")
    stages = page.locator("table.stages tr.stage")
    assert [stages.nth(i).get_attribute("data-stage") for i in range(4)] == ["init", "run", "postrun", "evaluate"]
    assert all(stages.nth(i).locator(".status").inner_text() == "done" for i in range(4))
    assert "file" in page.locator("#evaluations").inner_text()
    stored = captures(context.factory, ui_store.solved)
    tree = page.locator("#capture-tree tr.capture")
    assert tree.count() == len(stored) == 2
    assert tree.nth(0).get_attribute("data-kind") == "root" and tree.nth(1).get_attribute("data-kind") == "exact"
    assert tree.nth(1).get_attribute("data-parent") == str(stored[0].id)
    details = tree.nth(1).locator("details.lazy-json")
    details.locator("summary").click()
    page.wait_for_function(
        "() => !document.querySelector('details.lazy-json[open] pre').textContent.includes('loading')"
    )
    assert '"response"' in details.locator("pre").inner_text()
    screenshot(page, "ui-rollout", full_page=True)

    (row,) = trajectories(context.factory, ui_store.solved)
    traj = page.locator(f'article[data-trajectory="{row.id}"]')
    tokens = traj.locator(".tokens .t")
    assert tokens.count() == len(row.prompt_ids) + len(row.response_ids)
    marks = traj.locator(".tokens .t[data-m]").evaluate_all("els => els.map(e => Number(e.dataset.m))")
    # The fixture's replies are scripted, so nothing trains (loss 0); the page shows exactly the stored mask.
    assert marks == list(row.loss_mask) and sum(marks) == row.n_loss_tokens
    highlighted = traj.locator(".tokens .t.m1").evaluate_all("els => els.length")
    assert highlighted == sum(row.loss_mask)
    # Logprob on hover, and the heat scale on the sampled tokens.
    first_sampled = traj.locator(".tokens .t[data-lp]").first  # a sampled token has its real logprob
    first_sampled.hover()
    assert "logprob" in (first_sampled.get_attribute("title") or "")
    traj.locator(".heat-switch").check()
    assert "heat" in traj.get_attribute("class")
    traj.locator(".heat-switch").uncheck()
    traj.locator(".tokens").evaluate("box => { box.scrollTop = box.scrollHeight; }")  # the sampled part
    screenshot(traj, "ui-trajectory")


def test_compare_shows_two_rollouts_of_the_task_side_by_side(page, ui_store):
    page.goto(f"{ui_store.url}/ui/groups/{ui_store.task_id}")
    assert page.locator("#mean").inner_text() == "0.50" and page.locator("#std").inner_text() == "0.50"
    page.click('button:has-text("Compare")')
    page.wait_for_url("**/ui/compare?**")
    sides = page.locator(".compare .side")
    assert sides.count() == 2
    assert [sides.nth(i).get_attribute("data-rollout") for i in range(2)] == [ui_store.solved, ui_store.failed]
    assert [sides.nth(i).locator("h2 .reward").inner_text() for i in range(2)] == ["1.00", "0.00"]
    assert sides.nth(0).locator(".trajectory").count() == 1 and sides.nth(1).locator(".trajectory").count() == 1


def test_an_unknown_id_is_a_clear_404_page(page, ui_store):
    for path in ("/ui/rollouts/no-such-rollout", "/ui/groups/no-such-task", "/ui/trajectories/999999/tokens"):
        reply = page.goto(ui_store.url + path)
        assert reply.status == 404, path
        assert page.locator("h1").inner_text() == "Not found"
    assert "no rollout no-such-rollout" in page.goto(ui_store.url + "/ui/rollouts/no-such-rollout").text()


def test_a_crashed_rollout_shows_its_failure_and_a_fully_masked_trajectory(page, ui_store, context):
    page.goto(f"{ui_store.url}/ui/rollouts/{ui_store.crashed}")
    assert KILLED.search(page.locator("#failure").inner_text())
    assert page.locator('tr.stage[data-stage="evaluate"]').count() == 1
    for row in trajectories(context.factory, ui_store.crashed):
        traj = page.locator(f'article[data-trajectory="{row.id}"]')
        assert "training filter: rollout_error" in traj.locator("header").inner_text()
        marks = traj.locator(".tokens .t[data-m]").evaluate_all("els => els.map(e => Number(e.dataset.m))")
        assert marks == list(row.loss_mask) and set(marks) == {0} and traj.locator(".t.m1").count() == 0


def test_running_rollouts_refresh_in_the_table(page, ui_store, context):
    with session_scope(context.factory) as db:
        task = Task(name="live", instruction="-", harness={"name": "agent"}, runtime={}, evaluator={}, num_samples=1)
        db.add(task)
        db.flush()
        row = Rollout(task_id=task.id, status=RolloutStatus.RUNNING)
        db.add(row)
        db.flush()
        rollout_id = row.id
    page.goto(f"{ui_store.url}/ui/rollouts?task=live")
    assert page.locator(f'tr[data-rollout="{rollout_id}"]').get_attribute("data-status") == "RUNNING"
    with session_scope(context.factory) as db:
        db.get(Rollout, rollout_id).status = RolloutStatus.COMPLETED
    # The page polls while a row is running: the row turns COMPLETED without a reload.
    page.wait_for_selector(f'tr[data-rollout="{rollout_id}"][data-status="COMPLETED"]', timeout=30_000)
