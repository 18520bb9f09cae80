"""A caller of the capture writer, waiting on its event loop for its row's commit, and how its wait runs out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from db import Capture


@dataclass(frozen=True)
class Stored:
    """Where a committed capture landed."""

    id: int
    seq: int


@dataclass(eq=False)
class Pending:
    row: Capture
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Stored]
    key_hash: str | None = None  # commit only while the session is open under this key (None: unchecked)
    expired: bool = False  # its caller's wait ran out (``expire``)


def expire(pending: Pending) -> None:
    if not pending.future.done():
        pending.expired = True
        pending.future.cancel()
