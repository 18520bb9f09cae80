"""Takeover is conditional (``state.claim``), on SQLite and Postgres: another owner's rollout is taken only when
its heartbeat is stale and its flow run is not running; of two claimers racing for a dead owner's rollout
exactly one wins; a rollout whose owner gave up (a recorded failure) is free."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from db.models import Rollout
from polar.errors import RolloutClaimed
from polar.rollout import Stage, state, submit_tasks
from polar.rollout.context import store_factory
from tests.pg import STORES, migrated_store
from tests.rollout.helpers import answer_task, rollout_row, test_settings

CLAIM = {"default_timeout_s": 60}


@pytest.fixture(params=STORES)
def factory(request, tmp_path, cache_dir) -> Iterator:
    with migrated_store(request.param, tmp_path) as url:
        yield store_factory(test_settings(tmp_path, cache_dir, url))


def _silence(factory, rollout_id: str, seconds: float) -> None:
    with factory() as db, db.begin():
        db.execute(
            sa.update(Rollout)
            .where(Rollout.id == rollout_id)
            .values(heartbeat_at=state.now() - timedelta(seconds=seconds))
        )


def test_a_live_or_running_owner_is_never_taken_over(factory):
    (rid,) = submit_tasks(factory, [answer_task(samples=1)])[0].rollout_ids
    state.claim(factory, rid, "flow-a", stale_after_s=600, **CLAIM)
    # A fresh heartbeat: refused, whatever the caller asks.
    with pytest.raises(RolloutClaimed, match="heartbeat"):
        state.claim(factory, rid, "flow-b", stale_after_s=600, takeover=True, **CLAIM)
    _silence(factory, rid, 3600)
    asked = []

    def running(owner: str, silent_s: float) -> bool:
        asked.append((owner, silent_s))
        return False  # its flow run is still running (Prefect says so)

    with pytest.raises(RolloutClaimed, match="still running"):
        state.claim(factory, rid, "flow-b", stale_after_s=600, takeover=True, owner_gone=running, **CLAIM)
    assert asked and asked[0][0] == "flow-a" and asked[0][1] >= 3600
    row = rollout_row(factory, rid)
    assert row.flow_run_id == "flow-a" and row.attempt == 1 and row.closed_at is None  # untouched, not revoked
    # Stale and gone: taken over, and the old owner's session revoked in the same statement.
    state.claim(factory, rid, "flow-b", stale_after_s=600, takeover=True, owner_gone=lambda o, s: True, **CLAIM)
    row = rollout_row(factory, rid)
    assert row.flow_run_id == "flow-b" and row.attempt == 2 and row.closed_at is not None


def test_two_claimers_of_a_dead_owners_rollout_never_both_win(factory):
    (rid,) = submit_tasks(factory, [answer_task(samples=1)])[0].rollout_ids
    state.claim(factory, rid, "dead-flow", stale_after_s=600, **CLAIM)
    _silence(factory, rid, 3600)
    both_checked = threading.Barrier(2)

    def gone(owner: str, silent_s: float) -> bool:
        both_checked.wait(timeout=10)  # both have read the row and found its owner dead before either writes
        return True

    outcomes: dict[str, object] = {}

    def claim(owner: str) -> None:
        try:
            outcomes[owner] = state.claim(
                factory, rid, owner, stale_after_s=600, takeover=True, owner_gone=gone, **CLAIM
            )
        except RolloutClaimed as exc:
            outcomes[owner] = exc

    threads = [threading.Thread(target=claim, args=(name,)) for name in ("retry-a", "retry-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    lost = [owner for owner, outcome in outcomes.items() if isinstance(outcome, RolloutClaimed)]
    assert len(outcomes) == 2 and len(lost) == 1, outcomes
    assert "meanwhile" in str(outcomes[lost[0]])
    row = rollout_row(factory, rid)
    assert row.flow_run_id != lost[0] and row.attempt == 2


def test_a_rollout_whose_owner_gave_up_is_free(factory):
    (rid,) = submit_tasks(factory, [answer_task(samples=1)])[0].rollout_ids
    state.claim(factory, rid, "flow-a", stale_after_s=600, **CLAIM)
    state.begin_stage(factory, rid, Stage.INIT, "flow-a", default_timeout_s=60)
    state.mark_failed(factory, rid, Stage.INIT, "flow-a", "prepare failed")
    started = time.monotonic()
    view = state.claim(factory, rid, "retry", stale_after_s=600, takeover=True, owner_gone=lambda o, s: False, **CLAIM)
    assert time.monotonic() - started < 5 and view.owner == "retry"
    assert rollout_row(factory, rid).stage_results["previous_failures"][0]["error"] == "prepare failed"
