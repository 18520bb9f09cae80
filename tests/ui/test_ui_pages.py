"""The web UI's pages over a store, on SQLite and Postgres, without a browser: filters of the rollout table,
a group's reward spread, a long synthetic session's rollout page (capture tree with the builder's own break
causes, every token page's mask equal to the stored loss mask), capture JSON, and clear 400/404 pages."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from db.engine import make_engine, make_session_factory, session_scope
from db.enums import RolloutStatus
from db.models import Capture, MergeStat, Rollout, Task, Trajectory
from db.request_json import full_request_json
from flows.dispatch import run_inline
from polar.api import create_api
from polar.trajectory.prefix_merge import link_kinds
from polar.trajectory.store import build_and_store, load_capture_records
from polar.ui import tokens as ui_tokens
from tests.rollout.conftest import postgres_url, sqlite_url, store_url  # noqa: F401
from tests.rollout.helpers import test_settings
from tests.trajectory.synthetic import RandomChooser, SessionShape, SessionSimulator, write_session

TOKEN = "pages-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclasses.dataclass(frozen=True)
class Store:
    client: TestClient
    factory: object
    long_id: str
    task_id: str
    rewards: dict[str, float]


def _task(db, name: str, harness: str, group: str) -> Task:
    task = Task(
        name=name,
        instruction=f"do {name}",
        harness={"name": harness},
        runtime={},
        evaluator={"type": "file"},
        num_samples=3,
        meta={"group": group},
    )
    db.add(task)
    db.flush()
    return task


@pytest.fixture(scope="module")
def store(tmp_path_factory, cache_dir, small_tokenizer, store_url) -> Iterator[Store]:
    engine = make_engine(store_url)
    factory = make_session_factory(engine)
    shape = dataclasses.replace(SessionShape(), tool_output_chars=300, rerender=0.2)  # breaks: history rewritten
    rewards = {}
    with session_scope(factory) as db:
        long_task = _task(db, "long", "synthetic", "g-long")
        short_task = _task(db, "short", "other", "g-short")
        rows = []
        for i, reward in enumerate((1.0, 0.0, 0.5)):
            row = Rollout(
                task_id=long_task.id if i == 0 else short_task.id,
                sample_index=i,
                status=RolloutStatus.COMPLETED,
                reward=reward,
                weight_version_min="v0",
                weight_version_max="v3" if i == 0 else "v0",
            )
            db.add(row)
            db.flush()
            session = SessionSimulator(small_tokenizer, RandomChooser(i), shape=shape).run(60 if i == 0 else 4)
            write_session(db, row.id, session)
            rows.append(row.id)
            rewards[row.id] = reward
        db.add(Rollout(task_id=short_task.id, sample_index=3, status=RolloutStatus.RUNNING))
        short_id = short_task.id
    for rid in rows:
        with session_scope(factory) as db:
            build_and_store(db, rid, builder="prefix_merge")
    settings = test_settings(tmp_path_factory.mktemp("ui"), cache_dir, store_url, control_token=TOKEN)
    client = TestClient(create_api(settings, factory, run_inline=run_inline))
    yield Store(client, factory, rows[0], short_id, rewards)
    engine.dispose()


def listed(store: Store, query: str) -> list[str]:
    reply = store.client.get(f"/ui/rollouts?{query}", headers=AUTH)
    assert reply.status_code == 200, reply.text
    return re.findall(r'<tr data-rollout="([^"]+)"', reply.text)


def test_the_table_filters_by_each_field(store):
    everything = listed(store, "")
    assert len(everything) == 4
    assert listed(store, "task=long") == [store.long_id]
    assert listed(store, "harness=synthetic") == [store.long_id]
    assert len(listed(store, "harness=other")) == 3
    assert len(listed(store, "status=RUNNING")) == 1
    assert sorted(listed(store, "min_reward=0.5")) == sorted(r for r, v in store.rewards.items() if v >= 0.5)
    assert listed(store, "min_reward=0.2&max_reward=0.7") == [r for r, v in store.rewards.items() if v == 0.5]
    assert listed(store, "version=v3") == [store.long_id]
    assert listed(store, "group=g-long") == [store.long_id]
    tomorrow = (datetime.now() + timedelta(days=2)).date().isoformat()
    assert listed(store, f"since={tomorrow}") == [] and len(listed(store, f"until={tomorrow}")) == 4
    assert 'data-live="yes"' in store.client.get("/ui/rollouts", headers=AUTH).text  # a RUNNING row refreshes
    rows = store.client.get("/ui/rollouts?fragment=rows&status=RUNNING", headers=AUTH)
    assert rows.text.strip().startswith("<tr") and rows.text.count("<tr") == 1


def test_paging_and_bad_filters(store):
    reply = store.client.get("/ui/rollouts?offset=2", headers=AUTH)
    assert len(re.findall(r"<tr data-rollout=", reply.text)) == 2 and "3–4 of 4" in reply.text
    for query, words in [
        ("min_reward=abc", "min_reward must be a number"),
        ("status=DONE", "is not one of PENDING"),
        ("since=yesterday", "since must be a date"),
        ("offset=-1", "offset must be a non-negative integer"),
    ]:
        reply = store.client.get(f"/ui/rollouts?{query}", headers=AUTH)
        assert reply.status_code == 400 and words in reply.text, query


def test_a_group_shows_its_reward_spread(store):
    page = store.client.get(f"/ui/groups/{store.task_id}", headers=AUTH).text
    # rewards 0.0 and 0.5 (the RUNNING sample has none): mean 0.25, std 0.25, advantages -1 and +1
    assert '<dd id="mean">0.25</dd>' in page and '<dd id="std">0.25</dd>' in page
    assert page.count("-1.00") == 1 and page.count("+1.00") == 1


def test_a_long_rollout_page_shows_the_builders_decisions_and_the_stored_mask(store, monkeypatch):
    monkeypatch.setattr(ui_tokens, "PAGE_TOKENS", 500)  # so the longer traces span several pages
    reply = store.client.get(f"/ui/rollouts/{store.long_id}", headers=AUTH)
    assert reply.status_code == 200
    page = reply.text
    with store.factory() as db:
        kinds = link_kinds(load_capture_records(db, store.long_id))
        stat = db.query(MergeStat).filter_by(rollout_id=store.long_id).one()
        trajs = db.query(Trajectory).filter_by(rollout_id=store.long_id).order_by(Trajectory.chain_index).all()
        n_captures = db.query(Capture).filter_by(rollout_id=store.long_id).count()
    shown = dict(re.findall(r'data-capture="(\d+)" data-parent="\d*" data-kind="([^"]+)"', page))
    assert len(shown) == n_captures and shown == {str(k): v for k, v in kinds.items()}
    breaks = [v for v in shown.values() if v not in ("root", "exact", "inexact", "failed")]
    # Branch splits are counted as breaks too (a second child of one call); the tree marks the other causes.
    assert 0 < len(breaks) <= stat.breaks
    for cause, count in stat.break_causes.items():
        if cause != "branch":  # a branch is a split, not a capture that failed to extend its parent
            assert breaks.count(cause) == count
        assert f"{cause} {count}" in page
    assert "failed call" in page and "truncated" in page and "malformed tool call" in page
    # Only the first trajectories are inline; every page of every trajectory holds exactly its stored mask.
    assert page.count('class="trajectory"') == len(trajs) > 3
    assert page.count('<span class="tpage"') == 3
    longest = max(trajs, key=lambda t: t.n_prompt + t.n_response)
    assert longest.n_prompt + longest.n_response > 2 * ui_tokens.PAGE_TOKENS
    boundaries = 0
    for t in trajs:
        marks, tokens, page_no, shown_versions = [], 0, 0, []
        while True:
            html = store.client.get(f"/ui/trajectories/{t.id}/tokens?page={page_no}", headers=AUTH).text
            marks += [int(m) for m in re.findall(r'<span class="t m[01][^"]*" data-m="([01])"', html)]
            shown_versions += re.findall(r'class="vb"[^>]*>v:([^<]+)<', html)
            tokens += len(re.findall(r'<span class="t ', html))
            if 'class="more"' not in html:
                break
            page_no += 1
        assert marks == list(t.loss_mask) and tokens == t.n_prompt + t.n_response
        # A marker wherever the sampling weight version changes (spans sorted by start; the first one too).
        changes = [s["version"] for s in sorted(t.version_spans, key=lambda s: s["start"])]
        changes = [v for i, v in enumerate(changes) if i == 0 or v != changes[i - 1]]
        assert shown_versions == changes
        boundaries += len(changes) > 1
    assert boundaries > 0  # the synthetic session updates weights mid-session


def test_capture_json_as_stored_and_rebuilt(store):
    with store.factory() as db:
        child = db.query(Capture).filter(Capture.rollout_id == store.long_id, Capture.parent_id.is_not(None)).first()
        expected = full_request_json(db, child)
        stored = child.request_json
    body = store.client.get(f"/ui/captures/{child.id}.json", headers=AUTH).json()
    assert body["request"] == stored and body["capture_id"] == child.id
    assert store.client.get(f"/ui/captures/{child.id}.json?full=1", headers=AUTH).json()["request"] == expected
    assert store.client.get("/ui/captures/987654321.json", headers=AUTH).status_code == 404
    assert store.client.get(f"/ui/captures/{child.id}.json").status_code == 401


def test_unknown_ids_are_404_pages_and_compare_needs_one_task(store):
    paths = (
        "/ui/rollouts/nope",
        "/ui/groups/nope",
        "/ui/trajectories/424242/tokens",
        "/ui/trajectories/x/tokens",
        "/ui/x/y",
    )
    assert store.client.get("/ui/static/ui.css").status_code == 200
    for path in paths:
        reply = store.client.get(path, headers=AUTH)
        assert reply.status_code == 404 and "<h1>Not found</h1>" in reply.text, path
    other = next(r for r in store.rewards if r != store.long_id)
    reply = store.client.get(f"/ui/compare?a={store.long_id}&b={other}", headers=AUTH)
    assert reply.status_code == 400 and "different tasks" in reply.text
    assert store.client.get("/ui/compare?a=x", headers=AUTH).status_code == 400
    assert store.client.get("/ui/compare?a=x&b=y", headers=AUTH).status_code == 404


def test_the_token_record_is_served_by_the_api_and_shown_on_the_rollout_page(store):
    """Every untrained token's reason, the trainable count after the filter and the root causes: the same numbers
    from ``GET /v1/rollouts/{id}/stats`` (typed) and on the rollout page."""
    with store.factory() as db:
        stat = db.query(MergeStat).filter_by(rollout_id=store.long_id).one()
        expected = (stat.sampled_tokens, stat.trainable_tokens, stat.untrained_tokens or {}, stat.root_causes or {})
    reply = store.client.get(f"/v1/rollouts/{store.long_id}/stats", headers=AUTH)
    assert reply.status_code == 200, reply.text
    (build,) = reply.json()["builds"]
    assert build["builder"] == "prefix_merge"
    assert (build["sampled_tokens"], build["trainable_tokens"], build["untrained_tokens"], build["root_causes"]) == (
        expected
    )
    assert expected[1] is not None
    page = store.client.get(f"/ui/rollouts/{store.long_id}", headers=AUTH).text
    assert f"{expected[1]} trained after it" in page
    for reason, count in expected[2].items():
        assert f"{reason} {count}" in page
    assert store.client.get("/v1/rollouts/nope/stats", headers=AUTH).status_code == 404
