"""Waits on the store for ``polar serve`` (the control API and its web UI): a blocking call in a worker thread,
bounded in time.

A frozen store (a stopped Postgres, a SQLite write lock held) used to hold every ``/v1`` and ``/ui`` request
and ``/health`` with no answer at all. Each wait here ends within its bound (``POLAR_STORE_STATEMENT_TIMEOUT_S``
for requests, as on the gateway) with a ``StoreError``: a 503 with ``Retry-After``, so clients back off. The
thread itself cannot be stopped: it finishes when the store answers, and its result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from polar.errors import StoreError

T = TypeVar("T")


async def in_store(fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, waited for at most ``timeout_s`` (then a ``StoreError``)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), timeout_s)
    except TimeoutError:
        raise StoreError(f"the store did not answer within {timeout_s:g} s") from None
