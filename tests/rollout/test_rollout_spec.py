"""TaskRequest validation: every mistake is refused at submission, with the field named."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from db.enums import RolloutStatus, TaskStatus
from db.models import Rollout, Task
from polar.errors import InvalidRequest
from polar.rollout import dispatch_order, parse_task_request, submit_tasks
from tests.rollout.helpers import FAIL, SOLVE, answer_task


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"instruction": ""}, "instruction", "at least 1 character"),
        ({"num_samples": 0}, "num_samples", "greater than or equal to 1"),
        ({"harness": {"name": "nope"}}, "harness.name", "unknown harness 'nope'"),
        (
            {"harness": {"name": "agent", "config": {"max_turns": 0}}},
            "harness.config.max_turns",
            "greater than or equal to 1",
        ),
        ({"harness": {"name": "agent", "config": {"turns": 3}}}, "harness.config.turns", "Extra inputs"),
        ({"harness": {"name": "command"}}, "harness.config.command", "Field required"),
        ({"evaluator": {"type": "magic"}}, "evaluator.type", "unknown evaluator 'magic'"),
        ({"evaluator": {"type": "file", "config": {"path": "a"}}}, "evaluator.config", "exactly one of equals"),
        ({"runtime": {"type": "vm"}}, "runtime.type", "unknown runtime 'vm'"),
        ({"runtime": {"prepare": [{"type": "exec"}]}}, "runtime.prepare.0", "needs command"),
        (
            {"runtime": {"prepare": [{"command": "x", "max_attempts": 11}]}},
            "runtime.prepare.0.max_attempts",
            "less than or equal to 10",
        ),
        ({"builder": "zip"}, "builder", "unknown builder 'zip'"),
        ({"builder_options": {"train_roles": ["boss"]}}, "builder_options.train_roles.0", "'main'"),
        ({"builder_options": {"reward": "all"}}, "builder_options.reward", "'broadcast'"),
        ({"timeout_s": -1}, "timeout_s", "greater than 0"),
        ({"policies": [{"type": "scripted", "replies": "x"}]}, "policies.0.replies", "valid list"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_bad_requests_name_the_field(change, field, words):
    with pytest.raises(InvalidRequest) as caught:
        parse_task_request(answer_task(**change))
    assert caught.value.field == field
    assert words in caught.value.message and field in caught.value.message


def test_submit_stores_a_task_and_one_rollout_per_sample(context):
    submitted = submit_tasks(
        context.factory, [answer_task(name="a", samples=3), answer_task(name="b", samples=1, priority=9)]
    )
    assert [len(t.rollout_ids) for t in submitted] == [3, 1]
    assert dispatch_order(submitted)[0] == submitted[1].rollout_ids[0]  # higher priority first
    with context.factory() as db:
        task = db.get(Task, submitted[0].task_id)
        assert task.status is TaskStatus.PENDING and task.name == "a" and task.harness["name"] == "agent"
        rows = db.scalars(sa.select(Rollout).where(Rollout.task_id == task.id).order_by(Rollout.sample_index)).all()
    assert [r.sample_index for r in rows] == [0, 1, 2]
    assert all(r.status is RolloutStatus.PENDING and r.session_token_hash is None for r in rows)
    # Policies cycle over the samples.
    assert [r.policy["policy"] for r in rows] == [SOLVE, FAIL, SOLVE]
    assert task.builder_options is None  # the defaults are not stored


def test_builder_options_are_stored_with_the_task(context):
    request = answer_task(builder_options={"train_roles": ["main", "title"], "reward": "per_role"})
    (submitted,) = submit_tasks(context.factory, [request])
    with context.factory() as db:
        task = db.get(Task, submitted.task_id)
        assert task.builder_options == {"train_roles": ["main", "title"], "reward": "per_role"}


def test_a_bad_task_in_a_batch_stores_nothing(context):
    with context.factory() as db:
        before = db.scalar(sa.select(sa.func.count()).select_from(Task))
    with pytest.raises(InvalidRequest) as caught:
        submit_tasks(context.factory, [answer_task(), answer_task(harness={"name": "nope"})])
    assert caught.value.field == "tasks.1.harness.name"
    with context.factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(Task)) == before
