"""The cyclic garbage collector held off while a worker thread decodes a body that is likely refused.

Decoding a 13 MB body of 100,000 tool definitions makes about a million containers; every 5,000 of them start a
young collection, and every thousand middle collections a full one, which walks every object the process made since
start-up (``polar.proxy.server.tune_runtime`` froze the rest) and held the event loop 0.2-0.6 s (bench_big_tools,
2 cores). A body whose size already exceeds what the context window can hold is decoded with the collector off: a
refused one is freed by reference counting as soon as its error is raised, never walked; an accepted one (rare:
escapes or images) is walked once by the next young collection, as its containers would have been anyway.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection while any holder is inside (threads may nest and overlap; the collector's state before
    the first holder is restored after the last)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
