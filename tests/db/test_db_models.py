"""Rows round-trip through the models on SQLite and Postgres; constraints hold on both."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from db_factories import CaptureTreeBuilder, add_rollout, add_task
from sqlalchemy.orm import Session, selectinload

from db.enums import CaptureStatus, RolloutStatus, TaskStatus
from db.models import Capture, Evaluation, Rollout, Task, Trajectory, WeightVersion


def float32(values: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def _tree(session: Session) -> tuple[Rollout, dict[str, Capture]]:
    """root -> child -> grandchild, plus a canonical-mode branch off the root."""
    task = add_task(session)
    rollout = add_rollout(session, task_id=task.id, policy={"replies": ["ls", "done"]})
    tree = CaptureTreeBuilder(session, rollout)
    root = tree.add([1, 2, 3, 4], [10, 11], logprobs=[-0.1, -1.7])
    child = tree.add([*tree.sequence_of(root), 5, 6], [12, 13, 14], parent=root)
    grandchild = tree.add([*tree.sequence_of(child), 7], [15], parent=child, finish_reason="length")
    branch = tree.add([1, 2, 3, 99], [16], parent=root, status=CaptureStatus.ERROR, error="backend 502")
    return rollout, {"root": root, "child": child, "grandchild": grandchild, "branch": branch}


def test_capture_tree_round_trips(db_engine: sa.Engine, db_session: Session) -> None:
    rollout, captures = _tree(db_session)
    db_session.commit()
    ids = {name: capture.id for name, capture in captures.items()}

    with Session(db_engine) as fresh:
        loaded = fresh.scalars(sa.select(Capture).where(Capture.rollout_id == rollout.id).order_by(Capture.seq)).all()
        by_id = {capture.id: capture for capture in loaded}
        root, child, grandchild, branch = (by_id[ids[name]] for name in ("root", "child", "grandchild", "branch"))

        assert [c.seq for c in loaded] == [0, 1, 2, 3]
        assert (root.parent_id, child.parent_id, grandchild.parent_id, branch.parent_id) == (
            None,
            root.id,
            child.id,
            root.id,
        )
        assert (root.prefix_len, root.prompt_delta_ids, root.output_ids) == (0, [1, 2, 3, 4], [10, 11])
        assert (child.prefix_len, child.prompt_delta_ids) == (6, [5, 6])
        assert (grandchild.prefix_len, grandchild.prompt_delta_ids, grandchild.finish_reason) == (11, [7], "length")
        assert (branch.prefix_len, branch.prompt_delta_ids, branch.render_mode) == (3, [99], "canonical")
        assert root.output_logprobs == float32([-0.1, -1.7])
        assert child.output_logprobs == float32([-0.25] * 3)
        assert root.request_json["messages"][0] == {"role": "user", "content": "turn 0"}
        assert root.version_spans == [{"version": "v1", "start": 0, "end": 2}]
        assert root.matched_stop is None
        assert (branch.status, branch.error) == (CaptureStatus.ERROR, "backend 502")
        assert type(branch.status) is CaptureStatus
        assert root.created_at.tzinfo is not None


def test_task_and_rollout_defaults_and_enums(db_engine: sa.Engine, db_session: Session) -> None:
    task = add_task(db_session)
    rollout = add_rollout(db_session, task_id=task.id)
    rollout.status = RolloutStatus.TIMEOUT
    rollout.stage_results = {"init": {"runtime_id": "r-1"}, "run": None}
    rollout.finished_at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    db_session.commit()

    with Session(db_engine) as fresh:
        task_row = fresh.get_one(Task, task.id)
        rollout_row = fresh.scalars(
            sa.select(Rollout).options(selectinload(Rollout.task)).where(Rollout.id == rollout.id)
        ).one()

    assert len(task.id) == 36
    assert (task_row.builder, task_row.priority, task_row.status) == ("prefix_merge", 0, TaskStatus.PENDING)
    assert task_row.meta == {"group": "g1", "step": 3}
    assert task_row.harness == {"name": "codex", "args": ["--full-auto"]}
    assert task_row.created_at <= task_row.updated_at
    assert (rollout_row.sample_index, rollout_row.attempt, rollout_row.stage_timings) == (0, 0, {})
    assert rollout_row.status is RolloutStatus.TIMEOUT and rollout_row.status.is_terminal
    assert rollout_row.stage_results == {"init": {"runtime_id": "r-1"}, "run": None}
    assert rollout_row.finished_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert rollout_row.task is not None and rollout_row.task.id == task.id
    with db_engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT status FROM rollouts WHERE id = :id"), {"id": rollout.id})
        assert stored.scalar_one() == "TIMEOUT"


def test_a_rollout_needs_no_task(db_session: Session) -> None:
    rollout = add_rollout(db_session, session_token_hash="ab" * 32)
    db_session.commit()
    assert rollout.task_id is None and rollout.status is RolloutStatus.PENDING


def test_trajectory_evaluation_and_weight_version_round_trip(db_engine: sa.Engine, db_session: Session) -> None:
    rollout, captures = _tree(db_session)
    db_session.add_all(
        [
            Trajectory(
                rollout_id=rollout.id,
                builder="prefix_merge",
                chain_index=0,
                capture_ids=[captures["root"].id, captures["child"].id],
                prompt_ids=[1, 2, 3, 4],
                response_ids=[10, 11, 5, 6, 12],
                loss_mask=[1, 1, 0, 0, 1],
                response_logprobs=[-0.1, -1.7, 0.0, 0.0, -0.3],
                reward=1.0,
                version_spans=[{"version": "v1", "start": 0, "end": 5}],
                turn_count=2,
                n_prompt=4,
                n_response=5,
                n_loss_tokens=3,
                status="COMPLETED",
            ),
            Evaluation(rollout_id=rollout.id, evaluator="command", reward=0.5, details={"exit_code": 1}),
            WeightVersion(version="step-1", checkpoint_uri="s3://ckpt/1"),
            WeightVersion(version="step-2"),
        ]
    )
    db_session.commit()

    with Session(db_engine) as fresh:
        loaded = fresh.scalars(
            sa.select(Rollout)
            .options(selectinload(Rollout.trajectories), selectinload(Rollout.evaluations))
            .where(Rollout.id == rollout.id)
        ).one()
        latest = fresh.scalars(sa.select(WeightVersion).order_by(WeightVersion.id.desc()).limit(1)).one()

    (trajectory,) = loaded.trajectories
    assert trajectory.loss_mask == [1, 1, 0, 0, 1]
    assert trajectory.response_logprobs == float32([-0.1, -1.7, 0.0, 0.0, -0.3])
    assert trajectory.capture_ids == [captures["root"].id, captures["child"].id]
    assert trajectory.consumed_by is None
    assert [(e.evaluator, e.reward, e.details) for e in loaded.evaluations] == [("command", 0.5, {"exit_code": 1})]
    assert latest.version == "step-2"


def test_relationships_never_load_lazily(db_session: Session) -> None:
    rollout, _ = _tree(db_session)
    db_session.commit()
    db_session.expire(rollout)
    with pytest.raises(sa.exc.InvalidRequestError, match="lazy='raise'"):
        _ = rollout.captures


def test_seq_is_unique_per_rollout(db_session: Session) -> None:
    rollout, _ = _tree(db_session)
    tree = CaptureTreeBuilder(db_session, rollout)  # numbers from seq 0 again
    with pytest.raises(sa.exc.IntegrityError):
        tree.add([1], [2])


def test_seq_may_repeat_across_rollouts(db_session: Session) -> None:
    first, second = add_rollout(db_session), add_rollout(db_session)
    CaptureTreeBuilder(db_session, first).add([1], [2])
    CaptureTreeBuilder(db_session, second).add([1], [2])
    db_session.commit()


def test_capture_of_missing_rollout_is_rejected(db_session: Session) -> None:
    ghost = Rollout(id="00000000-0000-0000-0000-000000000000")  # never added to the session
    with pytest.raises(sa.exc.IntegrityError):
        CaptureTreeBuilder(db_session, ghost).add([1], [2])


def test_capture_with_missing_parent_is_rejected(db_session: Session) -> None:
    rollout = add_rollout(db_session)
    with pytest.raises(sa.exc.IntegrityError):
        CaptureTreeBuilder(db_session, rollout).add([1], [2], parent_id=10**9)


def test_unknown_status_strings_are_rejected(db_session: Session) -> None:
    db_session.add(Rollout(status="FINISHED"))
    with pytest.raises(sa.exc.StatementError, match="FINISHED"):
        db_session.flush()


def test_deleting_a_rollout_removes_its_rows(db_engine: sa.Engine, db_session: Session) -> None:
    rollout, _ = _tree(db_session)
    db_session.add(Evaluation(rollout_id=rollout.id, evaluator="command", reward=1.0))
    db_session.commit()

    db_session.delete(rollout)
    db_session.commit()

    with db_engine.connect() as connection:
        for table in ("captures", "evaluations", "rollouts"):
            assert connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
        assert connection.execute(sa.text("SELECT count(*) FROM tasks")).scalar_one() == 1


def test_counts_are_plain_sql(db_engine: sa.Engine, db_session: Session) -> None:
    rollout, captures = _tree(db_session)
    other = add_rollout(db_session)
    CaptureTreeBuilder(db_session, other).add([1, 2], [3, 4, 5, 6, 7])
    db_session.commit()

    with db_engine.connect() as connection:
        row = connection.execute(
            sa.text(
                "SELECT sum(n_output), sum(n_prompt_delta), max(n_prompt), count(*)"
                " FROM captures WHERE rollout_id = :rollout_id"
            ),
            {"rollout_id": rollout.id},
        ).one()

    assert tuple(row) == (
        sum(len(c.output_ids) for c in captures.values()),
        sum(len(c.prompt_delta_ids) for c in captures.values()),
        captures["grandchild"].n_prompt,
        4,
    )
    assert row[2] == 12
