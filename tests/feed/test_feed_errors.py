"""ERROR rollouts (infrastructure failures) are left out of trainer claims: a group hands out only its non-ERROR
samples, and is claimable only when at least ``min_samples`` of them are not ERROR."""

from __future__ import annotations

from db.enums import TaskStatus
from polar.feed import claim
from tests.feed.groups import add_group


def test_error_samples_are_left_out_of_a_claimed_group(factory):
    task_id, ids = add_group(factory, samples=4, errors=1)
    batch = claim(factory, "trainer", max_groups=5)
    (group,) = batch.groups
    assert group.task_id == task_id
    assert [t.id for t in group.trajectories] == ids[:3] and all(t.status == "COMPLETED" for t in group.trajectories)


def test_a_group_needs_min_samples_that_are_not_error(factory):
    all_error, _ = add_group(factory, samples=2, errors=2, status=TaskStatus.FAILED)
    two_valid, _ = add_group(factory, samples=4, errors=2)
    assert claim(factory, "trainer", max_groups=5, min_samples=3).groups == []
    (group,) = claim(factory, "trainer", max_groups=5).groups  # default: at least one
    assert group.task_id == two_valid and len(group.trajectories) == 2
    (group,) = claim(factory, "other", max_groups=5, min_samples=0).groups  # 0: also groups of ERRORs only
    assert group.task_id == all_error and group.trajectories == []
