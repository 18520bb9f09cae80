"""Durable capture writes with group commit (DESIGN §2.4: durable before acknowledged).

Concurrent calls hand their capture rows to one writer thread, which commits everything pending in one
transaction and then wakes each caller with its capture id. Throughput scales with concurrency while
every caller still waits for its own commit. ``seq`` numbers are assigned in the transaction
(max + 1 per rollout); if another gateway process took the same number, the batch is retried.

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
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, session_scope
from polar.errors import PolarError, StoreError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    row: Capture
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]


class CaptureWriter:
    def __init__(self, factory: sessionmaker[Session], *, max_batch: int = 128, retries: int = 5):
        self._factory = factory
        self._max_batch = max_batch
        self._retries = retries
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.commits = 0  # transactions committed (for benchmarks)

    async def write(self, row: Capture, *, timeout_s: float | None = None) -> int:
        """Commit ``row`` (its ``seq`` is assigned here) and return its id. Raises StoreError on failure, or
        when the commit has not finished within ``timeout_s``."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        pending = _Pending(row, loop, loop.create_future())
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
        ids, error, row_fault = self._attempt(batch)
        if ids is not None:
            self.commits += 1
            for pending, capture_id in zip(batch, ids, strict=True):
                pending.loop.call_soon_threadsafe(_resolve, pending.future, capture_id, None)
            return
        if row_fault and len(batch) > 1:  # find the offending row(s): the rest commit
            half = len(batch) // 2
            self._commit(batch[:half])
            self._commit(batch[half:])
            return
        assert error is not None
        for pending in batch:
            pending.loop.call_soon_threadsafe(_resolve, pending.future, None, error)

    def _attempt(self, batch: list[_Pending]) -> tuple[list[int] | None, PolarError | None, bool]:
        """Insert the batch: (ids, None, _) on success, else (None, error, whether a row may be at fault)."""
        conflict: IntegrityError | None = None
        for _attempt in range(self._retries):
            try:
                return self._insert([p.row for p in batch]), None, False
            except IntegrityError as exc:
                conflict = exc  # a seq taken by another process between our max() and insert: recount
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
        return None, _row_error(conflict, batch, "could not assign a capture sequence number after retries"), True

    def _insert(self, rows: list[Capture]) -> list[int]:
        with session_scope(self._factory) as db:
            next_seq: dict[str, int] = {}
            for row in rows:
                if row.rollout_id not in next_seq:
                    latest = db.scalar(sa.select(sa.func.max(Capture.seq)).where(Capture.rollout_id == row.rollout_id))
                    next_seq[row.rollout_id] = -1 if latest is None else latest
                next_seq[row.rollout_id] += 1
                row.seq = next_seq[row.rollout_id]
                row.id = None  # type: ignore[assignment]  # a rolled-back attempt's id on the (transient) row
            db.add_all(rows)
            db.flush()
            return [row.id for row in rows]


def _row_error(exc: Exception, batch: list[_Pending], context: str = "") -> StoreError:
    """The database's own reason (its first line), naming the session when it is one row's fault."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = detail[0] if detail else exc.__class__.__name__
    where = f" of session {batch[0].row.rollout_id}" if len(batch) == 1 else ""
    prefix = f"{context}: " if context else ""
    if len(batch) == 1:
        log.warning("capture%s refused by the store: %s", where, reason)
    return StoreError(f"could not store the capture{where}: {prefix}{exc.__class__.__name__}: {reason}"[:2000])


def _resolve(future: asyncio.Future[int], value: int | None, error: BaseException | None) -> None:
    if future.done():  # the caller went away (client disconnect); the capture is stored regardless
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)  # type: ignore[arg-type]
