"""Waiting on the store from the event loop: a blocking call in a worker thread, bounded in time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from polar.errors import StoreError
from polar.slices import in_thread

T = TypeVar("T")


async def in_store(fn: Callable[..., T], *args: Any, timeout_s: float) -> T:
    """``fn(*args)`` (a blocking store call) in a worker thread, waited for at most ``timeout_s``: a frozen or
    unreachable store is a ``StoreError`` (503) within that time, never a hang."""
    try:
        return await asyncio.wait_for(in_thread(fn, *args), timeout_s)
    except TimeoutError:
        raise StoreError(f"the store did not answer within {timeout_s:g} s") from None
