"""Waiting on the store from an event loop (the gateway's calls, ``polar serve``'s requests and web UI): a blocking
store call in a worker thread, bounded in time.

A frozen store (a stopped Postgres, a SQLite write lock held) must never hold a request with no answer: each wait
here ends within its bound (``POLAR_STORE_STATEMENT_TIMEOUT_S``) with a ``StoreError``, a 503 with
``Retry-After``, so clients back off. The thread itself cannot be stopped: it finishes when the store answers, and
its result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from polar.errors import StoreError
from polar.slices import in_thread

T = TypeVar("T")


async def in_store(fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, waited for at most ``timeout_s`` (then a ``StoreError``)."""
    try:
        return await asyncio.wait_for(in_thread(partial(fn, *args, **kwargs)), timeout_s)
    except TimeoutError:
        raise StoreError(f"the store did not answer within {timeout_s:g} s") from None
