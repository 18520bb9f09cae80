"""Every reader tolerates every state the capture writer leaves (``tests/trajectory/fault_store.py`` builds them
through the real gateway and a faulty SGLang server): an empty engine output is an ERROR capture naming its cause,
and the UI pages (200 and HTML, before and after a build), ``polar trajectories rebuild`` (the CLI as a user types
it), the RL and SFT exports (JSONL and parquet) and ``polar verify`` all read ERROR, UNACKNOWLEDGED, INTERRUPTED and
legacy empty-output captures, poisoned chains, sessions with no captures and unfinished ones; SQLite and Postgres."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from db import session_scope
from db.enums import CaptureStatus, RolloutStatus
from db.models import Capture, Rollout, Trajectory
from flows.dispatch import run_inline
from polar.api import create_api
from polar.backends.sglang import SGLangBackend
from polar.export import ExportFilter, export
from polar.serving.threaded import ServerThread
from polar.trajectory.verify import load_captures, verify_rollout
from polar.trajectory.verify_rows import check_stored
from tests.rollout.conftest import postgres_url, sqlite_url, store_url  # noqa: F401
from tests.trajectory.fault_store import FAULTS, INFO, FaultStore, fake_sglang, fault_store

TOKEN = "faults-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory, cache_dir, store_url) -> Iterator[FaultStore]:
    with fault_store(tmp_path_factory.mktemp("faults"), cache_dir, store_url) as built:
        yield built


def _captures(store: FaultStore, name: str) -> list[Capture]:
    with store.factory() as db:
        rid = store.sessions[name]
        return list(db.scalars(sa.select(Capture).where(Capture.rollout_id == rid).order_by(Capture.seq)))


def test_an_empty_output_is_an_error_capture_naming_its_cause(store):
    for name in ("empty-only", "empty-between", "empty-stream"):
        rows = _captures(store, name)
        failed = [c for c in rows if c.status is CaptureStatus.ERROR]
        assert len(failed) == 1 and "no output tokens" in (failed[0].error or ""), (name, failed)
        assert all(c.n_output > 0 for c in rows if c.status is CaptureStatus.OK), name
    for fault in FAULTS:  # every fault is one ERROR capture with its cause; the calls around it are OK
        statuses = [c.status for c in _captures(store, f"{fault}-between")]
        assert statuses == [CaptureStatus.OK, CaptureStatus.ERROR, CaptureStatus.OK], (fault, statuses)
    legacy = _captures(store, "legacy-empty-first")
    assert legacy[0].status is CaptureStatus.OK and list(legacy[0].output_ids) == []  # the old rows, as stored
    assert [c.admission for c in _captures(store, "poisoned")][1] == "unresolved"


def _pages(client: TestClient, store: FaultStore) -> None:
    """Every UI page over the store answers 200 with HTML (JSON for a capture's bodies)."""
    paths = ["/ui/rollouts", "/ui/rollouts?fragment=rows", "/ui/live", "/ui/live?fragment=fleet"]
    paths += ["/ui/live?fragment=curves", "/ui/rollouts?status=ERROR", "/ui/rollouts?status=RUNNING"]
    for rid in store.sessions.values():
        paths += [f"/ui/rollouts/{rid}", f"/ui/rollouts/{rid}?fragment=stages"]
    for path in paths:
        reply = client.get(path, headers=AUTH)
        assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text[:500]}"
        assert reply.headers["content-type"].startswith("text/html") and "<" in reply.text, path
    with store.factory() as db:
        captures = list(db.scalars(sa.select(Capture.id)))
        trajectories = list(db.scalars(sa.select(Trajectory.id)))
    for capture_id in captures:
        for full in ("0", "1"):
            reply = client.get(f"/ui/captures/{capture_id}.json?full={full}", headers=AUTH)
            assert reply.status_code == 200 and reply.json()["capture_id"] == capture_id, reply.text[:300]
    for trajectory_id in trajectories:
        reply = client.get(f"/ui/trajectories/{trajectory_id}/tokens", headers=AUTH)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html"), reply.text[:300]


def _only_faults() -> list[str]:
    return [f"{fault}-only" for fault in FAULTS]


def _rebuild(store: FaultStore, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POLAR_HOME": str(store.settings.home), "POLAR_CACHE": str(store.settings.cache)}
    command = [sys.executable, "-m", "polar.cli", "trajectories", "rebuild", "--url", store.url, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_every_reader_reads_every_state(store, tmp_path):
    settings = store.settings.model_copy(update={"control_token": TOKEN})
    factory = store.factory
    client = TestClient(create_api(settings, factory, run_inline=run_inline))
    _pages(client, store)  # before any build: captures only

    for builder in ("prefix_merge", "per_request"):
        done = _rebuild(store, "--since", "2000-01-01", "--builder", builder)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "failed 0" in done.stdout and "skipped 1" in done.stdout, done.stdout  # the open session waits
    with factory() as db:
        built = set(db.scalars(sa.select(Trajectory.rollout_id)))
        trainable = dict(
            db.execute(
                sa.select(Trajectory.rollout_id, sa.func.sum(Trajectory.n_loss_tokens)).group_by(Trajectory.rollout_id)
            ).all()
        )
    # Every finished session with an OK capture has traces (one whose only call failed has none to build).
    closed = {rid for name, rid in store.sessions.items() if name not in ("still-open", "no-captures", *_only_faults())}
    assert closed <= built, closed - built
    assert trainable[store.sessions["rollout-error"]] == 0  # fail-closed: a rollout that errored never trains
    _pages(client, store)  # and after: traces, merge stats, token pages

    for kind in ("rl", "sft"):
        for suffix in ("jsonl", "parquet"):
            path = tmp_path / f"{kind}.{suffix}"
            report = export(factory, settings, path, kind=kind, filters=ExportFilter(include_scripted=True))
            got = len(path.read_text().splitlines()) if suffix == "jsonl" else pq.read_metadata(path).num_rows
            assert report.rows == got > 0, (kind, suffix)
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert {r["rollout_id"] for r in rows} >= {store.sessions["legacy-empty-first"], store.sessions["poisoned"]}

    app = fake_sglang()  # verify re-feeds the OK captures; the fake replays what it sampled
    with ServerThread(app) as server:
        import asyncio

        async def verify() -> list[str]:
            backend = SGLangBackend(server.url, model_info=INFO, timeout_s=30.0)
            try:
                with factory() as db:  # the captures, and the rows a trainer reads checked against them
                    loaded = [(rid, load_captures(db, rid)) for rid in store.sessions.values()]
                    rows = {rid: check_stored(db, rid, captures, 1e-5) for rid, captures in loaded}
                    return [(await verify_rollout(backend, rid, c, rows[rid])).line() for rid, c in loaded]
            finally:
                await backend.aclose()

        lines = asyncio.run(verify())
    assert len(lines) == len(store.sessions) and all(re.match(r"(ok|FAIL|not checked) ", line) for line in lines), lines


def test_a_failed_rebuild_exits_non_zero(store, tmp_path):
    """A rollout whose captures break the tree contract fails its rebuild; the CLI says so and exits 1."""
    factory = store.factory
    rid = store.sessions["unacknowledged"]
    with session_scope(factory) as db:
        child = db.scalars(sa.select(Capture).where(Capture.rollout_id == rid).order_by(Capture.seq.desc())).first()
        assert child is not None and child.parent_id is not None
        saved = child.prefix_len
        child.prefix_len = 10**6  # past its parent's sequence: no full prompt can be rebuilt
    try:
        done = _rebuild(store, "--rollout", rid)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"failed {rid}" in done.stdout and "failed 1" in done.stdout, done.stdout
        with factory() as db:  # the UI still shows it, with what is wrong
            assert db.get(Rollout, rid).status is RolloutStatus.COMPLETED
        client = TestClient(
            create_api(store.settings.model_copy(update={"control_token": TOKEN}), factory, run_inline=run_inline)
        )
        reply = client.get(f"/ui/rollouts/{rid}", headers=AUTH)
        assert reply.status_code == 200 and "text/html" in reply.headers["content-type"], reply.text[:500]
    finally:
        with session_scope(factory) as db:
            db.execute(sa.update(Capture).where(Capture.id == child.id).values(prefix_len=saved))
