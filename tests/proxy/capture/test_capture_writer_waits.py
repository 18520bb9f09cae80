"""A caller's wait for its capture: a store slower than ``timeout_s`` is a ``StoreError`` and the row, if it commits
after all, is marked unacknowledged (a phantom is never trained); a caller cancelled from outside is cancelled,
not told the store failed."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from db import Capture, Rollout, session_scope
from db.enums import CaptureStatus
from polar.errors import StoreError
from polar.proxy.capture.writer import CaptureWriter
from tests.pg import migrated_factory
from tests.proxy.capture.test_capture_writer_connection import _row


def _rollout(factory) -> str:
    with session_scope(factory) as db:
        rollout = Rollout()
        db.add(rollout)
        db.flush()
        return rollout.id


def _statuses(factory, rollout_id: str) -> list[str]:
    with session_scope(factory) as db:
        return list(db.scalars(sa.select(Capture.status).where(Capture.rollout_id == rollout_id).order_by(Capture.seq)))


def _wait_for_statuses(factory, rollout_id: str, want: list[str], timeout_s: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (got := _statuses(factory, rollout_id)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


@contextmanager
def _busy_store(tmp_path) -> Iterator[tuple[object, CaptureWriter, str, sqlite3.Connection]]:
    """A writer on a SQLite store whose write lock another connection holds (``BEGIN IMMEDIATE``): the writer's
    transaction waits behind it until the test commits ``lock``."""
    with migrated_factory("sqlite", tmp_path) as factory:
        writer = CaptureWriter(factory)
        rollout_id = _rollout(factory)
        lock = sqlite3.connect(tmp_path / "polar.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            yield factory, writer, rollout_id, lock
        finally:
            writer.close()
            lock.close()


def _assert_a_phantom_then_ok(factory, rollout_id: str) -> None:
    """The first row committed after its caller left (kept, unacknowledged); the second was acknowledged."""
    want = [CaptureStatus.UNACKNOWLEDGED, CaptureStatus.OK]
    assert _wait_for_statuses(factory, rollout_id, want) == want


def test_a_wait_past_the_timeout_is_a_store_error_and_a_late_commit_is_unacknowledged(tmp_path):
    with _busy_store(tmp_path) as (factory, writer, rollout_id, lock):

        async def scenario() -> None:
            started = time.monotonic()
            with pytest.raises(StoreError, match=r"did not commit the capture within 0.3 s"):
                await writer.store(_row(rollout_id), timeout_s=0.3)
            assert time.monotonic() - started < 2
            lock.execute("COMMIT")  # the store frees: the row commits after its caller gave up
            assert (await writer.store(_row(rollout_id), timeout_s=30)).seq == 1

        asyncio.run(scenario())
        _assert_a_phantom_then_ok(factory, rollout_id)


def test_a_caller_cancelled_from_outside_is_cancelled_not_a_store_error(tmp_path):
    with _busy_store(tmp_path) as (factory, writer, rollout_id, lock):

        async def scenario() -> None:
            task = asyncio.create_task(writer.store(_row(rollout_id), timeout_s=30))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            lock.execute("COMMIT")
            assert (await writer.store(_row(rollout_id), timeout_s=30)).seq == 1

        asyncio.run(scenario())
        # The cancelled caller's row was already in a transaction: it committed, and is kept as a phantom.
        _assert_a_phantom_then_ok(factory, rollout_id)
