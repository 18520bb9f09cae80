"""Durable capture writes with group commit (durable before acknowledged).

Concurrent calls hand their capture rows to one writer thread, which commits everything pending in one
transaction (one counter update and one bulk insert, on its own connection: ``polar.proxy.capture.sql``)
and then wakes each caller with its capture id (one wake-up of the event loop per batch). Throughput scales
with concurrency while every caller still waits for its own commit. ``seq`` numbers are assigned in the
transaction from the rollout's counter (``rollouts.next_capture_seq``, incremented with ``UPDATE ... RETURNING``):
the row lock orders writers in every gateway process and replica, so there is no ``max(seq)`` read and no race.
Rollouts are locked in id order, so two writers' batches never deadlock. Only a capture inserted by something
that does not use the counter can make a number collide; then the counter is moved past the rollout's highest
seq and the batch is retried.

A bad row fails only itself: a row whose values cannot be encoded is refused alone, before the transaction; when
a batch fails for a reason other than the store itself (unreachable, a timeout, a lost connection), a value the
database rejects or a constraint is to blame, and the batch is split in halves and each half committed on its
own, down to single rows, so the other sessions' captures commit and the offending row's caller gets the
database's reason. A caller waits at most ``timeout_s`` (a frozen store is a 503, not a hang); a row whose
caller has given up before its transaction began is not written.

Acknowledged means delivered: a row that commits after its caller gave up (the caller already answered with a
503: a phantom commit) is marked ``UNACKNOWLEDGED`` by the writer right after, in its own transaction, and so is
any capture the service reports undelivered (``unacknowledge``: a stream whose client left before its last
frame). Such a capture is kept, never trained and never loaded as a parent.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, Rollout, session_scope
from db.engine import rows_matched
from db.enums import CaptureStatus
from polar.errors import PermissionDenied, PolarError, StoreError
from polar.proxy.capture import sql as capture_sql
from polar.proxy.capture.pending import Pending, Stored, expire

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Unacknowledge:
    """Captures committed whose callers never got them."""

    capture_ids: tuple[int, ...]


class CaptureWriter:
    def __init__(self, factory: sessionmaker[Session], *, max_batch: int = 128, retries: int = 5):
        self._factory = factory
        self._max_batch = max_batch
        self._retries = retries
        self._queue: queue.SimpleQueue[Pending | _Unacknowledge | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._conn: Connection | None = None  # the writer thread's own connection, kept between batches
        self._committing = False
        self.commits = 0  # transactions committed (for benchmarks)
        self.observe_commit: Callable[[int, float], None] | None = None  # (batch size, seconds): metrics

    async def write(self, row: Capture, *, timeout_s: float | None = None) -> int:
        """Commit ``row`` (its ``seq`` is assigned here) and return its id. Raises StoreError on failure, or
        when the commit has not finished within ``timeout_s``."""
        return (await self.store(row, timeout_s=timeout_s)).id

    async def store(self, row: Capture, *, timeout_s: float | None = None, key_hash: str | None = None) -> Stored:
        """Like ``write``, returning the capture's id and its seq. With ``key_hash`` the row commits only while
        its session is open under that key; otherwise ``PermissionDenied`` (closed or re-keyed meanwhile)."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        pending = Pending(row, loop, loop.create_future(), key_hash)
        self._queue.put(pending)
        if timeout_s is None:
            return await pending.future
        # One timer that cancels the future (not ``asyncio.wait_for``: a second future, a task wrapper and two
        # callbacks per call). A cancelled future is a caller that gave up: the writer skips its row if its
        # transaction has not begun, and marks it unacknowledged if it commits anyway (``_resolve_all``).
        timer = loop.call_later(timeout_s, expire, pending)
        try:
            return await pending.future
        except asyncio.CancelledError:
            if not pending.expired:
                raise  # the caller itself was cancelled
            raise StoreError(f"the store did not commit the capture within {timeout_s:g} s") from None
        finally:
            timer.cancel()

    def unacknowledge(self, *capture_ids: int) -> None:
        """Mark committed captures ``UNACKNOWLEDGED`` (their callers never got them), soon, on the writer thread."""
        if capture_ids:
            self._ensure_started()
            self._queue.put(_Unacknowledge(tuple(capture_ids)))

    def _ensure_started(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():  # every call: no lock taken once it runs
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="polar-capture-writer", daemon=True)
                self._thread.start()

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10)
        if self._conn is not None and (self._thread is None or not self._thread.is_alive()):
            conn, self._conn = self._conn, None
            conn.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if isinstance(first, _Unacknowledge):
                self._mark_unacknowledged(first.capture_ids)
                continue
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._commit(batch)
                    return
                if isinstance(item, _Unacknowledge):
                    self._mark_unacknowledged(item.capture_ids)
                    continue
                batch.append(item)
            self._commit(batch)

    def _mark_unacknowledged(self, capture_ids: tuple[int, ...]) -> None:
        try:
            with session_scope(self._factory) as db:
                db.execute(
                    sa.update(Capture)
                    .where(Capture.id.in_(capture_ids), Capture.status == CaptureStatus.OK)
                    .values(status=CaptureStatus.UNACKNOWLEDGED, error="committed, but its caller never got the reply")
                )
        except Exception:  # the writer thread must live on; the capture stays OK (logged for the operator)
            log.exception("could not mark captures %s unacknowledged", capture_ids)

    def _commit(self, batch: list[Pending]) -> None:
        batch = [p for p in batch if not p.future.done()]  # callers that timed out or went away
        if not batch:
            return
        started = time.perf_counter()
        ids, error, row_fault = self._attempt(batch)
        if ids is not None:
            self.commits += 1
            if self.observe_commit is not None:
                self.observe_commit(len(batch), time.perf_counter() - started)
            _wake(batch, ids, self.unacknowledge)
            return
        if row_fault and len(batch) > 1:  # find the offending row(s): the rest commit
            half = len(batch) // 2
            self._commit(batch[:half])
            self._commit(batch[half:])
            return
        assert error is not None
        _wake(batch, [error] * len(batch), self.unacknowledge)

    def _attempt(self, batch: list[Pending]) -> tuple[list[Stored | PolarError] | None, PolarError | None, bool]:
        """Insert the batch: (each row's Stored or refusal, None, _) on success, else (None, error, whether a row
        may be at fault)."""
        conflict: IntegrityError | None = None
        for _attempt in range(self._retries):
            try:
                return self._insert(batch), None, False
            except IntegrityError as exc:
                conflict = exc  # a seq taken by a writer that bypassed the counter (or a bad row)
                if not self._resync([p.row.rollout_id for p in batch]):
                    break  # the counters were right: a row itself broke a constraint
            except PolarError as exc:  # the store is unreachable: every row would fail alike
                return None, exc, False
            except (OperationalError, InterfaceError) as exc:  # a timeout or a lost connection: not a row's fault
                log.warning("capture commit failed: %s", exc.__class__.__name__)
                return None, _row_error(exc, batch), False
            except SQLAlchemyError as exc:  # the database (or a column type) refused a value
                return None, _row_error(exc, batch), True
            except Exception as exc:  # a value no code path expected; the writer thread must live on
                log.exception("unexpected error while storing captures")
                return None, _row_error(exc, batch), True
        assert conflict is not None
        return None, _row_error(conflict, batch, "could not assign a capture sequence number"), True

    def _insert(self, batch: list[Pending]) -> list[Stored | PolarError]:
        """One transaction on the writer's own connection (``polar.proxy.capture.sql``): the batch's rollout rows
        locked in id order (so concurrent writers never deadlock), one counter increment for all of them that
        also checks each session is open under its call's key, then one bulk insert. Rows of a revoked
        session are left out and get ``PermissionDenied``; a row whose values cannot be encoded gets its error.

        The connection is kept between batches (no pre-ping per transaction). One the server dropped fails the
        batch before its commit is sent; the batch is then tried once more on a new connection. A failure while
        committing is never retried: the commit may have landed."""
        try:
            return self._transaction(batch)
        except (PolarError, OperationalError, InterfaceError):
            conn, self._conn = self._conn, None
            dropped = conn is not None and conn.invalidated
            if conn is not None and not dropped and not conn.closed:
                # Closed without a round trip (the store may be frozen): its socket goes now, not when the object is
                # collected (a psycopg ResourceWarning, at some later test's or caller's expense).
                conn.invalidate()
            if not dropped or self._committing:
                raise
            log.warning("the capture writer's connection was dropped; retrying the batch on a new one")
            return self._transaction(batch)

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is None or conn.invalidated or conn.closed:
            if conn is not None:
                conn.close()
            engine = self._factory.kw["bind"]
            conn = self._conn = engine.connect()
        return conn

    def _transaction(self, batch: list[Pending]) -> list[Stored | PolarError]:
        self._committing = False
        conn = self._connection()
        dialect = conn.dialect
        refused: dict[int, PolarError] = {}
        encoded: dict[int, list[Any]] = {}
        for pending in batch:
            try:
                encoded[id(pending)] = capture_sql.encode_row(pending.row, dialect)
            except Exception as exc:  # noqa: BLE001 -- a value the column type refuses (an id beyond int32, ...): this row only
                refused[id(pending)] = _row_error(exc, [pending])
        groups: dict[tuple[str, str | None], list[Pending]] = {}
        for pending in batch:
            if id(pending) not in refused:
                groups.setdefault((pending.row.rollout_id, pending.key_hash), []).append(pending)
        with conn.begin() as transaction:
            rollout_ids = sorted({rollout_id for rollout_id, _ in groups})
            lock = capture_sql.lock_sql(dialect, len(rollout_ids))
            if lock is not None and len(rollout_ids) > 1:
                capture_sql.driver_rows(conn, lock, tuple(rollout_ids))
            ends = self._advance(conn, groups)
            rows: list[Pending] = []
            for (rollout_id, key_hash), members in groups.items():
                end = ends.get((rollout_id, key_hash))
                if end is None and key_hash is not None:
                    for pending in members:
                        refused[id(pending)] = PermissionDenied(
                            f"session {rollout_id} was closed or given a new key during this call"
                        )
                    continue
                # No rollout row at all: the insert below fails on its foreign key, as before.
                seq = (end if end is not None else len(members)) - len(members)
                for pending in members:
                    pending.row.seq = seq
                    encoded[id(pending)] = capture_sql.with_seq(encoded[id(pending)], seq)
                    seq += 1
                    rows.append(pending)
            if rows:
                inserted = capture_sql.insert_rows(conn, [encoded[id(pending)] for pending in rows])
                for pending, capture_id in zip(rows, inserted, strict=True):
                    pending.row.id = capture_id
            self._committing = True
            transaction.commit()
        self._committing = False
        out: list[Stored | PolarError] = []
        for pending in batch:
            error = refused.get(id(pending))
            if error is not None:
                out.append(error)
                continue
            out.append(Stored(pending.row.id, pending.row.seq))
        return out

    @staticmethod
    def _advance(
        conn: Connection, groups: dict[tuple[str, str | None], list[Pending]]
    ) -> dict[tuple[str, str | None], int]:
        """Increment the counters: one UPDATE for every rollout with one key in the batch (the usual case), one
        more per group of a rollout seen under two keys. Returns each group's counter after its increment;
        a group whose session is closed or re-keyed is missing."""
        per_rollout: dict[str, list[tuple[str | None, int]]] = {}
        for (rollout_id, key_hash), members in groups.items():
            per_rollout.setdefault(rollout_id, []).append((key_hash, len(members)))
        single = {r: g[0] for r, g in per_rollout.items() if len(g) == 1}
        ends: dict[tuple[str, str | None], int] = {}
        if single:
            params = tuple(v for r, (k, n) in single.items() for v in (r, n, k))
            sql = capture_sql.advance_sql(conn.dialect, len(single))
            for rollout_id, end in capture_sql.driver_rows(conn, sql, params):
                ends[rollout_id, single[rollout_id][0]] = end
        for rollout_id, keyed in per_rollout.items():
            if rollout_id in single:
                continue
            for key_hash, n in keyed:
                sql = capture_sql.advance_sql(conn.dialect, 1)
                for _, end in capture_sql.driver_rows(conn, sql, (rollout_id, n, key_hash)):
                    ends[rollout_id, key_hash] = end
        return ends

    def _resync(self, rollout_ids: list[str]) -> bool:
        """Move each counter past its rollout's highest seq; True when one was behind (False also when the
        store cannot tell: the batch then fails as a row's fault, never the writer thread)."""
        try:
            return self._move_counters(rollout_ids)
        except Exception:
            log.warning("could not check the capture counters", exc_info=True)
            return False

    def _move_counters(self, rollout_ids: list[str]) -> bool:
        moved = False
        with session_scope(self._factory) as db:
            for rollout_id in sorted(set(rollout_ids)):
                latest = db.scalar(sa.select(sa.func.max(Capture.seq)).where(Capture.rollout_id == rollout_id))
                if latest is None:
                    continue
                moved |= bool(
                    rows_matched(
                        db,
                        sa.update(Rollout)
                        .where(Rollout.id == rollout_id, Rollout.next_capture_seq <= latest)
                        .values(next_capture_seq=latest + 1),
                    )
                )
        return moved


def _row_error(exc: Exception, batch: list[Pending], context: str = "") -> StoreError:
    """The database's own reason (its first line), naming the session when it is one row's fault."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = detail[0] if detail else exc.__class__.__name__
    where = f" of session {batch[0].row.rollout_id}" if len(batch) == 1 else ""
    prefix = f"{context}: " if context else ""
    if len(batch) == 1:
        log.warning("capture%s refused by the store: %s", where, reason)
    return StoreError(f"could not store the capture{where}: {prefix}{exc.__class__.__name__}: {reason}"[:2000])


def _wake(batch: list[Pending], outcomes: list[Stored | PolarError], undelivered: Callable[..., None]) -> None:
    """Hand each caller its outcome: one wake-up of each event loop for the whole batch, not one per row.
    ``undelivered(*ids)``: captures stored whose callers had given up."""
    per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Stored], Stored | PolarError]]] = {}
    for pending, outcome in zip(batch, outcomes, strict=True):
        per_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, items in per_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, items, undelivered)
        except RuntimeError:  # that loop is closed: its callers are gone
            undelivered(*(o.id for _, o in items if isinstance(o, Stored)))


def _resolve_all(
    items: list[tuple[asyncio.Future[Stored], Stored | PolarError]], undelivered: Callable[..., None]
) -> None:
    lost: list[int] = []
    for future, outcome in items:
        if future.done():  # the caller gave up (a store timeout, a client that left): a stored row is a phantom
            if isinstance(outcome, Stored):
                lost.append(outcome.id)
        elif isinstance(outcome, Stored):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)
    undelivered(*lost)
