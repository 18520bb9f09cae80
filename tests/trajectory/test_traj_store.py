"""Trajectories through the store, on SQLite and Postgres: build, store, read back, rebuild, query the stats."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Capture, MergeStat, Rollout, Task, Trajectory
from polar.errors import InvalidRequest, NotFound
from polar.report.merges import format_summary, summarize_by_harness
from polar.settings import RenderMode
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.rebuild import rebuild
from polar.trajectory.store import TrajectoriesConsumed, build_and_store, load_capture_records, load_traces
from tests.trajectory.synthetic import RandomChooser, SessionShape, SessionSimulator, SyntheticSession, write_session

EVENTFUL = SessionShape(branch=0.2, retry=0.1, fail=0.1, truncate=0.2, drift=0.3, version_mid_reply=0.2, malformed=0.1)
MIXED = SessionShape(branch=0.2, truncate=0.2, drift=0.5, rerender=0.4)


def add_rollout(
    factory: sessionmaker[Session],
    tokenizer,
    *,
    seed: int,
    status: RolloutStatus = RolloutStatus.COMPLETED,
    shape: SessionShape = EVENTFUL,
    mode: RenderMode = RenderMode.APPEND,
    calls: int = 12,
    **fields,
) -> tuple[str, SyntheticSession]:
    """A rollout holding one generated session's captures."""
    session = SessionSimulator(tokenizer, RandomChooser(seed), shape=shape, mode=mode).run(calls)
    with session_scope(factory) as db:
        rollout = Rollout(status=status, **fields)
        db.add(rollout)
        db.flush()
        write_session(db, rollout.id, session)
        return rollout.id, session


def seed_where(tokenizer, shape: SessionShape, wanted: Callable[[SyntheticSession], bool]) -> int:
    """The first seed whose session has what a test needs (sessions are deterministic per seed)."""
    for seed in range(200):
        if wanted(SessionSimulator(tokenizer, RandomChooser(seed), shape=shape).run(12)):
            return seed
    raise AssertionError("no seed makes the session this test needs")


def rows_of(factory: sessionmaker[Session], rollout_id: str, builder: str) -> list[tuple[int, list[int]]]:
    with factory() as db:
        query = sa.select(Trajectory.id, Trajectory.response_ids).where(
            Trajectory.rollout_id == rollout_id, Trajectory.builder == builder
        )
        return [(row.id, row.response_ids) for row in db.execute(query.order_by(Trajectory.chain_index))]


def capture_snapshot(factory: sessionmaker[Session], rollout_id: str) -> list[tuple]:
    with factory() as db:
        table = Capture.__table__
        return [
            tuple(row)
            for row in db.execute(sa.select(table).where(table.c.rollout_id == rollout_id).order_by(table.c.seq))
        ]


def test_build_store_and_read_back(session_factory, small_tokenizer) -> None:
    rollout_id, session = add_rollout(session_factory, small_tokenizer, seed=1, reward=1.0)

    with session_scope(session_factory) as db:
        built = build_and_store(db, rollout_id, builder="prefix_merge")

    with session_factory() as db:
        assert load_traces(db, rollout_id, "prefix_merge") == list(built.traces)  # logprobs are exact in float32
        rows = db.scalars(
            sa.select(Trajectory).where(Trajectory.rollout_id == rollout_id).order_by(Trajectory.chain_index)
        ).all()
        records = load_capture_records(db, rollout_id)
    assert len(rows) == built.stats.traces_out > 0
    for row, trace in zip(rows, built.traces, strict=True):
        assert (row.n_prompt, row.n_response, row.n_loss_tokens) == (
            len(trace.prompt_ids),
            len(trace.response_ids),
            trace.n_loss_tokens,
        )
        assert (row.status, row.turn_count, row.reward) == ("COMPLETED", trace.turn_count, trace.reward)
    # Records loaded from the store build exactly what the in-memory session builds (ids aside).
    in_memory = prefix_merge(session.captures)
    assert [
        (t.prompt_ids, t.response_ids, t.loss_mask, t.response_logprobs, t.version_spans) for t in built.traces
    ] == [(t.prompt_ids, t.response_ids, t.loss_mask, t.response_logprobs, t.version_spans) for t in in_memory.traces]
    assert [r.n_malformed_tool_calls for r in records] == [c.n_malformed_tool_calls for c in session.captures]


def test_rebuild_with_the_other_builder_leaves_captures_and_rows_alone(session_factory, small_tokenizer) -> None:
    rollout_id, session = add_rollout(session_factory, small_tokenizer, seed=2)
    with session_scope(session_factory) as db:
        build_and_store(db, rollout_id, builder="prefix_merge")
    captures_before = capture_snapshot(session_factory, rollout_id)
    merged_before = rows_of(session_factory, rollout_id, "prefix_merge")

    report = rebuild(session_factory, builder="per_request", rollout_id=rollout_id)

    assert [r.rollout_id for r in report.rebuilt] == [rollout_id] and not report.skipped and not report.failed
    ok = sum(1 for c in session.captures if c.ok)
    assert report.traces_out == ok and report.captures_in == len(session.captures)
    assert "rebuilt 1 rollouts" in report.summary()
    assert capture_snapshot(session_factory, rollout_id) == captures_before
    assert len(rows_of(session_factory, rollout_id, "per_request")) == ok
    assert rows_of(session_factory, rollout_id, "prefix_merge") == merged_before

    # The same builder again replaces its rows (and its one stats row) in place of the old ones.
    rebuild(session_factory, builder="prefix_merge", rollout_id=rollout_id)
    replaced = rows_of(session_factory, rollout_id, "prefix_merge")
    with session_factory() as db:
        stats_rows = db.scalar(sa.select(sa.func.count()).where(MergeStat.rollout_id == rollout_id))
    assert [ids for _, ids in replaced] == [ids for _, ids in merged_before]
    assert {row_id for row_id, _ in replaced}.isdisjoint({row_id for row_id, _ in merged_before})
    assert stats_rows == 2
    assert capture_snapshot(session_factory, rollout_id) == captures_before


def test_merge_stats_are_queryable_with_plain_sql(session_factory, small_tokenizer) -> None:
    append_id, _ = add_rollout(session_factory, small_tokenizer, seed=3)
    rewrites = seed_where(
        small_tokenizer, MIXED, lambda s: "prompt_rewritten" in prefix_merge(s.captures).stats.break_causes
    )
    mixed_id, _ = add_rollout(session_factory, small_tokenizer, seed=rewrites, shape=MIXED)
    built = {}
    with session_scope(session_factory) as db:
        for rollout_id in (append_id, mixed_id):
            for builder in ("prefix_merge", "per_request"):
                built[rollout_id, builder] = build_and_store(db, rollout_id, builder=builder).stats

    with session_factory() as db:
        ids = {"a": append_id, "b": mixed_id}
        rows = db.execute(
            sa.text(
                "SELECT builder, SUM(captures_in - error_captures), SUM(traces_out), SUM(exact_merges),"
                " SUM(inexact_merges), SUM(breaks) FROM merge_stats WHERE rollout_id IN (:a, :b)"
                " GROUP BY builder ORDER BY builder"
            ),
            ids,
        ).all()
        postgres = db.get_bind().dialect.name == "postgresql"
        cause = "break_causes->>'prompt_rewritten'" if postgres else "json_extract(break_causes, '$.prompt_rewritten')"
        rewritten = db.execute(
            sa.text(f"SELECT {cause} FROM merge_stats WHERE rollout_id = :b AND builder = 'prefix_merge'"), ids
        ).scalar_one()
    expected = []
    for builder in ("per_request", "prefix_merge"):
        stats = [built[rid, builder] for rid in (append_id, mixed_id)]
        expected.append(
            (
                builder,
                sum(s.ok_captures for s in stats),
                sum(s.traces_out for s in stats),
                sum(s.exact_merges for s in stats),
                sum(s.inexact_merges for s in stats),
                sum(s.breaks for s in stats),
            )
        )
    assert [tuple(row) for row in rows] == expected
    assert int(rewritten) == built[mixed_id, "prefix_merge"].break_causes["prompt_rewritten"] > 0
    merged = built[mixed_id, "prefix_merge"]
    assert merged.traces_out < merged.ok_captures and merged.inexact_merges > 0


def test_rewards_and_the_training_filter_are_stored(session_factory, small_tokenizer) -> None:
    aligned = {"run": {"outcome": "TIMEOUT", "agent_budget_expired": True}}
    timeout_id, _ = add_rollout(
        session_factory, small_tokenizer, seed=4, status=RolloutStatus.TIMEOUT, reward=1.0, stage_results=aligned
    )
    error_id, _ = add_rollout(session_factory, small_tokenizer, seed=5, status=RolloutStatus.ERROR, reward=1.0)
    malformed = seed_where(
        small_tokenizer, EVENTFUL, lambda s: any(c.n_malformed_tool_calls for c in s.captures if c.ok)
    )
    malformed_id, _ = add_rollout(session_factory, small_tokenizer, seed=malformed, reward=1.0)

    with session_scope(session_factory) as db:
        kept = build_and_store(db, timeout_id)
        zeroed = build_and_store(db, error_id)
        completed = build_and_store(db, malformed_id)
        # The run stage knows the outcome before the row is terminal, and may say so.
        per_call = {c.id: 0.5 for c in load_capture_records(db, malformed_id) if c.ok}
        by_capture = build_and_store(
            db, malformed_id, builder="per_request", status="COMPLETED", trace_rewards=per_call
        )

    # An agent-budget timeout keeps its mask and the verifier's reward (1.0 here: it scored the state left).
    assert all(t.reward == 1.0 and t.filter_reason == "agent_timeout" and t.n_loss_tokens for t in kept.traces)
    assert all(t.reward == 0.0 and t.filter_reason == "rollout_error" and not t.n_loss_tokens for t in zeroed.traces)
    assert {(t.reward, t.filter_reason) for t in completed.traces if t.n_malformed_tool_calls} == {
        (0.0, "malformed_tool_call")
    }
    assert {t.reward for t in completed.traces if not t.n_malformed_tool_calls} <= {1.0}
    assert {t.reward for t in by_capture.traces if t.n_malformed_tool_calls} == {0.0}
    assert {t.reward for t in by_capture.traces if not t.n_malformed_tool_calls} == {0.5}
    with session_factory() as db:
        query = (
            sa.select(Trajectory.status, Trajectory.filter_reason, sa.func.sum(Trajectory.n_loss_tokens))
            .where(Trajectory.rollout_id.in_([timeout_id, error_id]))
            .group_by(Trajectory.status, Trajectory.filter_reason)
            .order_by(Trajectory.status)
        )
        rows = db.execute(query).all()
    assert [(r[0], r[1], r[2] > 0) for r in rows] == [
        ("ERROR", "rollout_error", False),
        ("TIMEOUT", "agent_timeout", True),
    ]


def test_consumed_trajectories_are_never_replaced(session_factory, small_tokenizer) -> None:
    rollout_id, _ = add_rollout(session_factory, small_tokenizer, seed=6)
    with session_scope(session_factory) as db:
        build_and_store(db, rollout_id)
    with session_scope(session_factory) as db:
        db.execute(
            sa.update(Trajectory)
            .where(Trajectory.rollout_id == rollout_id)
            .values(consumed_by="trainer-1", consumed_at=datetime.now(UTC))
        )

    with pytest.raises(TrajectoriesConsumed, match="consumed by a trainer"), session_scope(session_factory) as db:
        build_and_store(db, rollout_id)
    report = rebuild(session_factory, builder="prefix_merge", rollout_id=rollout_id)
    assert [rid for rid, _ in report.skipped] == [rollout_id] and not report.rebuilt
    assert rebuild(session_factory, builder="per_request", rollout_id=rollout_id).rebuilt  # another builder is fine
    with session_factory() as db:
        assert (
            db.scalar(
                sa.select(sa.func.count()).where(
                    Trajectory.rollout_id == rollout_id, Trajectory.consumed_by == "trainer-1"
                )
            )
            > 0
        )


def test_rebuild_by_task_and_date_skips_unfinished_and_reports_broken_rollouts(
    session_factory, small_tokenizer
) -> None:
    future = datetime(2100, 1, 1, tzinfo=UTC)  # rollouts of this test only, whatever else the database holds
    with session_scope(session_factory) as db:
        task = Task(instruction="fix", harness={"name": "codex"}, runtime={}, evaluator={}, num_samples=3)
        db.add(task)
        db.flush()
        task_id = task.id
    done, _ = add_rollout(session_factory, small_tokenizer, seed=7, task_id=task_id, created_at=future)
    running, _ = add_rollout(
        session_factory, small_tokenizer, seed=8, task_id=task_id, created_at=future, status=RolloutStatus.RUNNING
    )
    broken, _ = add_rollout(session_factory, small_tokenizer, seed=9, task_id=task_id, created_at=future)
    with session_scope(session_factory) as db:  # corrupt one capture: a root cannot keep a prefix
        first = db.scalars(sa.select(Capture).where(Capture.rollout_id == broken).order_by(Capture.seq)).first()
        first.prefix_len = 2

    by_task = rebuild(session_factory, builder="prefix_merge", task_id=task_id)
    by_date = rebuild(session_factory, builder="per_request", since=future)

    for report in (by_task, by_date):
        assert [r.rollout_id for r in report.rebuilt] == [done]
        assert [rid for rid, _ in report.skipped] == [running] and "RUNNING" in report.skipped[0][1]
        assert [rid for rid, _ in report.failed] == [broken] and "is a root but has prefix_len" in report.failed[0][1]
    assert rebuild(session_factory, builder="prefix_merge", since=datetime(2200, 1, 1, tzinfo=UTC)).rebuilt == ()
    with pytest.raises(NotFound):
        rebuild(session_factory, builder="prefix_merge", rollout_id="no-such-rollout")
    with pytest.raises(InvalidRequest, match="name a rollout"):
        rebuild(session_factory, builder="prefix_merge")
    with pytest.raises(InvalidRequest, match="unknown trajectory builder 'nope'; known: per_request, prefix_merge"):
        rebuild(session_factory, builder="nope", rollout_id=done)


def test_summary_by_harness_reads_sessions_from_the_store(session_factory, small_tokenizer) -> None:
    ids = {}
    with session_scope(session_factory) as db:
        for name in ("claude_code", "codex"):
            task = Task(instruction="fix", harness={"name": name}, runtime={}, evaluator={}, num_samples=2)
            db.add(task)
            db.flush()
            ids[name] = task.id
    rollouts = {
        "claude_code": [
            add_rollout(session_factory, small_tokenizer, seed=s, task_id=ids["claude_code"])[0] for s in (10, 11)
        ],
        "codex": [add_rollout(session_factory, small_tokenizer, seed=12, task_id=ids["codex"], shape=MIXED)[0]],
        "-": [add_rollout(session_factory, small_tokenizer, seed=13)[0]],
    }

    with session_factory() as db:
        rows = summarize_by_harness(db, [r for group in rollouts.values() for r in group])
        expected = {
            name: [prefix_merge(load_capture_records(db, r)).stats for r in group] for name, group in rollouts.items()
        }

    assert [row.harness for row in rows] == ["-", "claude_code", "codex"]
    for row in rows:
        stats = expected[row.harness]
        assert (row.rollouts, row.captures, row.traces) == (
            len(stats),
            sum(s.ok_captures for s in stats),
            sum(s.traces_out for s in stats),
        )
        assert row.merge_ratio == row.captures / row.traces
    assert rows[1].exact_rate == 1.0  # append mode
    table = format_summary(rows)
    assert "claude_code" in table and "ratio" in table.splitlines()[0]
