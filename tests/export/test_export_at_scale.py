"""Exports at any size: 5,000 trajectories with real captures (a real rollout's rows, cloned in bulk through the
capture writer's own SQL and the build's trajectory rows) export as SFT and RL, JSONL and parquet, on SQLite and
Postgres, every row once. An SFT export's traced memory is bounded by its batch, not by its rows."""

from __future__ import annotations

import json
import time
import tracemalloc
import uuid

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from db.engine import session_scope
from db.models import Capture, Rollout, Task, Trajectory
from polar.export import ExportFilter, export
from polar.proxy.capture.sql import COLUMNS, encode_row, insert_rows
from polar.trajectory.store import _trajectory_row, load_traces

N = 5000
CHUNK = 400  # rows per multi-row INSERT: 400 x the capture columns stays under SQLite's 32,766 variables
GROWTH_BOUND = 8 * 2**20  # 5,000 SFT rows held at once would be about 15 MB of text alone


def _copy(row: object, **changes: object) -> dict[str, object]:
    """An ORM row's column values by column name (``Task.meta`` is the column ``metadata``), id and time left out."""
    attrs = sa.inspect(type(row)).column_attrs
    values = {a.columns[0].name: getattr(row, a.key) for a in attrs}
    return {k: v for k, v in values.items() if k not in ("id", "created_at")} | changes


def clone(factory, rollout_id: str, n: int) -> str:
    """``n`` copies of a finished rollout (captures and trajectories) under a new task; returns the task's id."""
    with factory() as db:
        rollout = db.get(Rollout, rollout_id)
        task = db.get(Task, rollout.task_id)
        captures = list(db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout_id).order_by(Capture.seq)))
        traces = load_traces(db, rollout_id, task.builder)
        task_row = _copy(task, id=str(uuid.uuid4()), name="export-at-scale")
        rollouts = [
            _copy(rollout, id=str(uuid.uuid4()), task_id=task_row["id"], sample_index=i, session_token_hash=None)
            for i in range(n)
        ]
        templates = [{name: getattr(c, name) for name in COLUMNS} for c in captures]
        template_ids = [c.id for c in captures]
        builder, status = task.builder, str(rollout.status)
    assert traces and templates, (rollout_id, builder)
    with session_scope(factory) as db:
        db.execute(sa.insert(Task.__table__), [task_row])
        for at in range(0, n, CHUNK):
            db.execute(sa.insert(Rollout.__table__), rollouts[at : at + CHUNK])
        conn, dialect = db.connection(), db.get_bind().dialect
        mapped: list[dict[int, int]] = [{} for _ in range(n)]  # per clone: template capture id -> its copy's id
        for template_id, template in zip(template_ids, templates, strict=True):  # seq order: parents first
            encoded = []
            for clone_index, row in enumerate(rollouts):
                parent = template["parent_id"]
                values = template | {
                    "rollout_id": row["id"],
                    "parent_id": None if parent is None else mapped[clone_index][parent],
                }
                encoded.append(encode_row(Capture(**values), dialect))
            for at in range(0, n, CHUNK):
                ids = insert_rows(conn, encoded[at : at + CHUNK])
                for offset, new_id in enumerate(ids):
                    mapped[at + offset][template_id] = new_id
        trajectories = []
        for clone_index, row in enumerate(rollouts):
            for trace in traces:
                copy = _trajectory_row(row["id"], builder, trace, status)
                copy["capture_ids"] = [mapped[clone_index][c] for c in trace.capture_ids]
                trajectories.append(copy)
        for at in range(0, len(trajectories), CHUNK):
            db.execute(sa.insert(Trajectory), trajectories[at : at + CHUNK])
        return str(task_row["id"])


@pytest.fixture(scope="module")
def big(store_context, batch) -> tuple[str, int]:
    """The cloned task and how many trajectories it holds (N clones of a rollout that built one or more)."""
    factory = store_context.factory
    with factory() as db:
        rollout_id = db.scalars(
            sa.select(Rollout.id).where(Rollout.task_id == batch[0]).order_by(Rollout.sample_index)
        ).first()
        per_rollout = len(db.scalars(sa.select(Trajectory.id).where(Trajectory.rollout_id == rollout_id)).all())
    started = time.perf_counter()
    task_id = clone(factory, rollout_id, N)
    print(f"cloned {N} rollouts ({N * per_rollout} trajectories) in {time.perf_counter() - started:.1f} s")
    return task_id, N * per_rollout


def _count(path) -> int:
    if path.suffix == ".jsonl":
        with path.open() as lines:
            return sum(1 for _ in lines)
    return int(pq.read_metadata(path).num_rows)


@pytest.mark.parametrize("kind", ["sft", "rl"])
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_an_export_of_thousands_writes_every_row_once(store_context, big, tmp_path, kind, suffix):
    task_id, expected = big
    path = tmp_path / f"{kind}.{suffix}"
    started = time.perf_counter()
    report = export(
        store_context.factory,
        store_context.settings,
        path,
        kind=kind,
        filters=ExportFilter(task_ids=[task_id], include_scripted=True),
    )
    print(f"{kind} {suffix}: {report.rows} rows, {report.bytes} bytes in {time.perf_counter() - started:.1f} s")
    assert expected >= N and report.rows == _count(path) == expected
    if suffix == "jsonl":
        rows = path.read_text().splitlines()
        ids = [json.loads(line)["trajectory_id"] for line in rows]
        assert len(set(ids)) == len(ids) == expected and ids == sorted(ids)
        if kind == "sft":
            last = json.loads(rows[-1])
            assert last["messages"][-1]["role"] == "assistant" and last["task_id"] == task_id


def test_an_sft_export_streams_in_bounded_memory(store_context, big, batch, tmp_path):
    """Traced memory of 5,000 rows is within ``GROWTH_BOUND`` of a 4-row export's (both load the same parser): the
    peak is one batch of rows (``batch_rows``; each row's token arrays decoded), whatever the number of rows."""
    if store_context.settings.resolved_database_url.startswith("postgresql"):
        pytest.skip("the same streaming code on both stores: measured once, on SQLite")
    task_id, expected = big

    def peak(task_ids: list[str], name: str) -> tuple[int, int]:
        tracemalloc.reset_peak()
        report = export(
            store_context.factory,
            store_context.settings,
            tmp_path / name,
            kind="sft",
            filters=ExportFilter(task_ids=task_ids, include_scripted=True),
            batch_rows=50,
        )
        return report.rows, tracemalloc.get_traced_memory()[1]

    tracemalloc.start()
    try:
        small_rows, small = peak(batch, "small.jsonl")
        rows, large = peak([task_id], "large.jsonl")
    finally:
        tracemalloc.stop()
    print(f"sft jsonl traced peak: {small_rows} rows {small / 2**20:.1f} MiB, {rows} rows {large / 2**20:.1f} MiB")
    assert rows == expected and small_rows > 0 and large - small < GROWTH_BOUND
