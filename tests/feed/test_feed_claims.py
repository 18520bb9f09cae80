"""Trainer claims: complete groups only, exactly once, leases, release, staleness, on SQLite and Postgres."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from db.enums import ClaimStatus, TaskStatus
from db.models import Claim, Trajectory
from polar.errors import Conflict, InvalidRequest, NotFound
from polar.feed import ack, claim, register, release, renew
from tests.feed.groups import add_group


def trajectory_ids(batch) -> list[int]:
    return [t.id for group in batch.groups for t in group.trajectories]


def test_claim_hands_out_complete_groups_once_and_ack_consumes_them(factory):
    done, done_ids = add_group(factory)
    failed, failed_ids = add_group(factory, status=TaskStatus.FAILED)
    add_group(factory, status=TaskStatus.RUNNING)  # not every sample finished: not a group yet

    first = claim(factory, "trainer-a", max_groups=10)
    assert {g.task_id for g in first.groups} == {done, failed}
    assert sorted(trajectory_ids(first)) == sorted(done_ids + failed_ids)  # the task's builder only
    group = next(g for g in first.groups if g.task_id == done)
    assert [t.sample_index for t in group.trajectories] == [0, 1, 2, 3]
    assert group.metadata == {"group": "g"} and group.builder == "prefix_merge"
    sample = group.trajectories[1]
    assert len(sample.response_ids) == len(sample.loss_mask) == len(sample.response_logprobs) and sample.reward == 1.0

    assert claim(factory, "trainer-b", max_groups=10).groups == []
    result = ack(factory, first.claim_id, "trainer-a")
    assert result == {"claim_id": first.claim_id, "status": "ACKED", "groups": 2, "trajectories": 8}
    with factory() as db:
        consumed = dict(
            db.execute(sa.select(Trajectory.id, Trajectory.consumed_by).where(Trajectory.id.in_(done_ids))).all()
        )
    assert set(consumed.values()) == {"trainer-a"}
    assert claim(factory, "trainer-b", max_groups=10).groups == []
    with pytest.raises(Conflict, match="ACKED"):
        ack(factory, first.claim_id, "trainer-a")


def test_release_hands_groups_back_and_only_the_holder_may_ack(factory):
    task, _ = add_group(factory)
    batch = claim(factory, "a")
    with pytest.raises(Conflict, match="belongs to trainer 'a'"):
        ack(factory, batch.claim_id, "b")
    assert release(factory, batch.claim_id, "a")["status"] == "RELEASED"
    again = claim(factory, "b")
    assert [g.task_id for g in again.groups] == [task]
    with pytest.raises(Conflict, match="RELEASED"):
        release(factory, batch.claim_id, "a")


def test_expired_lease_frees_the_groups_for_another_trainer(factory):
    task, ids = add_group(factory)
    crashed = claim(factory, "crashed", lease_s=2.0)  # long enough for the next claim on a loaded machine
    assert claim(factory, "b").groups == []
    time.sleep(2.2)
    taken = claim(factory, "b")
    assert [g.task_id for g in taken.groups] == [task] and sorted(trajectory_ids(taken)) == sorted(ids)
    with factory() as db:
        assert db.get(Claim, crashed.claim_id).status is ClaimStatus.EXPIRED
    with pytest.raises(Conflict):
        ack(factory, crashed.claim_id, "crashed")
    assert ack(factory, taken.claim_id, "b")["trajectories"] == 4


def test_ack_after_the_lease_ran_out_is_refused_and_frees_the_groups(factory):
    task, _ = add_group(factory)
    batch = claim(factory, "slow", lease_s=0.2)
    time.sleep(0.4)
    with pytest.raises(Conflict, match="expired"):
        ack(factory, batch.claim_id, "slow")
    assert [g.task_id for g in claim(factory, "other").groups] == [task]


def test_renew_keeps_a_working_trainer_s_claim(factory):
    add_group(factory)
    batch = claim(factory, "a", lease_s=2.0)  # long enough for the renew on a loaded machine (0.3 s failed in CI)
    renew(factory, batch.claim_id, "a", lease_s=30)
    time.sleep(2.2)  # past the first lease: the renewed one holds
    assert claim(factory, "b").groups == []
    assert ack(factory, batch.claim_id, "a")["status"] == "ACKED"


def test_staleness_bound_skips_groups_sampled_too_many_versions_ago(factory):
    register(factory, "v1")
    old, _ = add_group(factory, version="v1")
    register(factory, "v2")
    register(factory, "v3")
    fresh, _ = add_group(factory, version="v3")
    unregistered, _ = add_group(factory, version="default")  # ordinal 0: three versions behind v3
    batch = claim(factory, "a", max_groups=10, max_staleness=1)
    assert [g.task_id for g in batch.groups] == [fresh] and batch.current_version == "v3"
    assert batch.groups[0].staleness == 0
    wider = claim(factory, "a", max_groups=10, max_staleness=2)
    assert [(g.task_id, g.staleness) for g in wider.groups] == [(old, 2)]
    rest = claim(factory, "a", max_groups=10)
    assert [(g.task_id, g.staleness) for g in rest.groups] == [(unregistered, 3)]


def test_bad_arguments_and_unknown_claims_get_named_errors(factory):
    with pytest.raises(InvalidRequest) as bad:
        claim(factory, "a", max_groups=0)
    assert bad.value.field == "max_groups"
    with pytest.raises(InvalidRequest) as bad:
        claim(factory, "", max_groups=1)
    assert bad.value.field == "trainer"
    with pytest.raises(InvalidRequest) as bad:
        claim(factory, "a", max_staleness=-1)
    assert bad.value.field == "max_staleness"
    with pytest.raises(NotFound):
        ack(factory, "no-such-claim", "a")
    with pytest.raises(Conflict):
        register(factory, "v1") and register(factory, "v1")


def test_concurrent_trainers_never_receive_the_same_trajectory(factory):
    expected = set()
    for _ in range(40):
        expected.update(add_group(factory, samples=2)[1])
    received: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def trainer(name: str) -> None:
        got: list[int] = []
        try:
            start.wait()
            while True:
                batch = claim(factory, name, max_groups=3)
                if not batch.groups:
                    break
                got += trajectory_ids(batch)
                ack(factory, batch.claim_id, name)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        received[name] = got

    threads = [threading.Thread(target=trainer, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    everything = [i for got in received.values() for i in got]
    assert len(everything) == len(set(everything)) == len(expected) and set(everything) == expected
    with factory() as db:
        unconsumed = db.scalar(
            sa.select(sa.func.count())
            .select_from(Trajectory)
            .where(Trajectory.builder == "prefix_merge", Trajectory.consumed_by.is_(None))
        )
    assert unconsumed == 0
