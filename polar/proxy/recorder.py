"""Durable capture writes with group commit (DESIGN §2.4: durable before acknowledged).

Concurrent calls hand their capture rows to one writer thread, which commits everything pending in one
transaction and then wakes each caller with its capture id. Throughput scales with concurrency while
every caller still waits for its own commit. ``seq`` numbers are assigned in the transaction from the
rollout's counter (``rollouts.next_capture_seq``, incremented with ``UPDATE ... RETURNING``): the row lock orders
writers in every gateway process and replica, so there is no ``max(seq)`` read and no race. Rollouts are
locked in id order, so two writers' batches never deadlock. Only a capture inserted by something that does not
use the counter can make a number collide; then the counter is moved past the rollout's highest seq and the
batch is retried.

A bad row fails only itself: when a batch fails for a reason other than the store itself (unreachable, a
timeout, a lost connection), a value the database rejects or a constraint is to blame, and the batch is split
in halves and each half committed on its own, down to single rows, so the other sessions' captures commit and
the offending row's caller gets the database's reason.
A caller waits at most ``timeout_s`` (a frozen store is a 503, not a hang); a row whose caller has given up
before its transaction began is not written.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, Rollout, session_scope
from db.engine import rows_matched
from polar.errors import PermissionDenied, PolarError, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stored:
    """Where a committed capture landed."""

    id: int
    seq: int


@dataclass(eq=False)
class _Pending:
    row: Capture
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Stored]
    key_hash: str | None = None  # commit only while the session is open under this key (None: unchecked)


class CaptureWriter:
    def __init__(self, factory: sessionmaker[Session], *, max_batch: int = 128, retries: int = 5):
        self._factory = factory
        self._max_batch = max_batch
        self._retries = retries
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
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
        pending = _Pending(row, loop, loop.create_future(), key_hash)
        self._queue.put(pending)
        try:
            return await asyncio.wait_for(pending.future, timeout_s)
        except TimeoutError:
            raise StoreError(f"the store did not commit the capture within {timeout_s:g} s") from None

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="polar-capture-writer", daemon=True)
                self._thread.start()

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._commit(batch)
                    return
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[_Pending]) -> None:
        batch = [p for p in batch if not p.future.done()]  # callers that timed out or went away
        if not batch:
            return
        started = time.perf_counter()
        ids, error, row_fault = self._attempt(batch)
        if ids is not None:
            self.commits += 1
            if self.observe_commit is not None:
                self.observe_commit(len(batch), time.perf_counter() - started)
            for pending, outcome in zip(batch, ids, strict=True):
                if isinstance(outcome, Stored):
                    pending.loop.call_soon_threadsafe(_resolve, pending.future, outcome, None)
                else:
                    pending.loop.call_soon_threadsafe(_resolve, pending.future, None, outcome)
            return
        if row_fault and len(batch) > 1:  # find the offending row(s): the rest commit
            half = len(batch) // 2
            self._commit(batch[:half])
            self._commit(batch[half:])
            return
        assert error is not None
        for pending in batch:
            pending.loop.call_soon_threadsafe(_resolve, pending.future, None, error)

    def _attempt(self, batch: list[_Pending]) -> tuple[list[Stored | PolarError] | None, PolarError | None, bool]:
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

    def _insert(self, batch: list[_Pending]) -> list[Stored | PolarError]:
        """One transaction: the batch's rollout rows locked in id order (so concurrent writers never deadlock),
        one counter increment for all of them that also checks each session is open under its call's key, then
        the rows. Rows of a revoked session are left out and get ``PermissionDenied``."""
        groups: dict[tuple[str, str | None], list[_Pending]] = {}
        for pending in batch:
            groups.setdefault((pending.row.rollout_id, pending.key_hash), []).append(pending)
        refused: dict[int, PolarError] = {}
        with session_scope(self._factory) as db:
            rollout_ids = sorted({rollout_id for rollout_id, _ in groups})
            if len(rollout_ids) > 1:
                db.execute(
                    sa.select(Rollout.id).where(Rollout.id.in_(rollout_ids)).order_by(Rollout.id).with_for_update()
                )
            ends = self._advance(db, groups)
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
                    seq += 1
                    pending.row.id = None  # type: ignore[assignment]  # a rolled-back attempt's id (transient row)
            rows = [p.row for p in batch if id(p) not in refused]
            db.add_all(rows)
            db.flush()
            return [refused.get(id(p)) or Stored(p.row.id, p.row.seq) for p in batch]

    @staticmethod
    def _advance(
        db: Session, groups: dict[tuple[str, str | None], list[_Pending]]
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
            open_under_key = [
                sa.and_(Rollout.id == r, Rollout.closed_at.is_(None), Rollout.session_token_hash == k)
                if k is not None
                else Rollout.id == r
                for r, (k, _) in single.items()
            ]
            step = sa.case({r: n for r, (_, n) in single.items()}, value=Rollout.id, else_=0)
            for rollout_id, end in db.execute(
                sa.update(Rollout)
                .where(sa.or_(*open_under_key))
                .values(next_capture_seq=Rollout.next_capture_seq + step)
                .returning(Rollout.id, Rollout.next_capture_seq)
            ):
                ends[rollout_id, single[rollout_id][0]] = end
        for rollout_id, keyed in per_rollout.items():
            if rollout_id in single:
                continue
            for key_hash, n in keyed:
                update = sa.update(Rollout).where(Rollout.id == rollout_id)
                if key_hash is not None:
                    update = update.where(Rollout.closed_at.is_(None), Rollout.session_token_hash == key_hash)
                after = db.scalar(
                    update.values(next_capture_seq=Rollout.next_capture_seq + n).returning(Rollout.next_capture_seq)
                )
                if after is not None:
                    ends[rollout_id, key_hash] = after
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


def _row_error(exc: Exception, batch: list[_Pending], context: str = "") -> StoreError:
    """The database's own reason (its first line), naming the session when it is one row's fault."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = detail[0] if detail else exc.__class__.__name__
    where = f" of session {batch[0].row.rollout_id}" if len(batch) == 1 else ""
    prefix = f"{context}: " if context else ""
    if len(batch) == 1:
        log.warning("capture%s refused by the store: %s", where, reason)
    return StoreError(f"could not store the capture{where}: {prefix}{exc.__class__.__name__}: {reason}"[:2000])


def _resolve(future: asyncio.Future[Stored], value: Stored | None, error: BaseException | None) -> None:
    if future.done():  # the caller went away (client disconnect); the capture is stored regardless
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)  # type: ignore[arg-type]
